"""zonemeter agent --pin-path / --cleanup / SIGTERM with pinned tables (fake datapath).

The kernel side (kill -9, restart, totals vs ground truth) is
tests/kernel/test_agent_restart.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent import cli
from agent.cli.agent import _run, pin_path_for
from tests.fixtures.topologies import write_snapshot
from tests.unit.cli.test_agent import FakeDatapath, _free_port
from tests.unit.cli.test_agent_live import ThreadStopper


class PinnedFake(FakeDatapath):
    def release(self) -> None:
        self.events.append("release")

    def close(self, keep_attached: bool = False) -> None:
        self.events.append("close")


def _args(*extra: str) -> Any:
    return cli.build_parser().parse_args(["agent", "--node-name", "nb", *extra])


@pytest.mark.parametrize("extra, want", [
    ((), ("/sys/fs/bpf/zonemeter/nb", False)),
    (("--netns", "zmabcd-node-a1"), (None, False)),       # lab/demo: no pinning by default
    (("--pin-path", "/sys/fs/bpf/x/nb"), ("/sys/fs/bpf/x/nb", True)),
    (("--pin-path", "none"), (None, True)),
])
def test_pin_path_default_and_overrides(extra: tuple[str, ...], want: tuple[Any, bool]) -> None:
    assert pin_path_for(_args(*extra)) == want


def test_bad_pin_path_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = write_snapshot(tmp_path / "c.json")
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", str(snap),
                   "--pin-path", "/sys/fs/bpf/a b"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "pin_path" in err, err


def test_sigterm_with_pinning_drains_exports_then_releases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.datapath

    snap = write_snapshot(tmp_path / "c.json")
    made: list[PinnedFake] = []
    monkeypatch.setattr(agent.datapath, "Datapath",
                        lambda config: made.append(PinnedFake(config)) or made[-1])  # type: ignore[func-returns-value]
    args = _args("--snapshot", str(snap), "--metrics-address", f"127.0.0.1:{_free_port()}",
                 "--interval", "0.2", "--pin-path", "/sys/fs/bpf/zmtest/nb")
    stopper = ThreadStopper()
    out: list[int] = []
    th = threading.Thread(target=lambda: out.append(_run(args, stopper)))  # type: ignore[arg-type]
    th.start()
    deadline = time.monotonic() + 15
    while not (made and "drain" in made[0].events) and time.monotonic() < deadline:
        time.sleep(0.05)
    stopper.event.set()
    th.join(30)
    assert out == [0]
    dp = made[0]
    assert dp.config.pin_path == "/sys/fs/bpf/zmtest/nb"
    ev = dp.events
    # no detach before the final drain: the filters keep counting into the pinned tables
    assert "release" in ev and ev.index("release") > max(i for i, e in enumerate(ev) if e == "drain")
    assert ev[ev.index("release") - 1] == "drain"


def test_cleanup_calls_datapath_cleanup(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import agent.datapath

    calls: list[tuple[Any, Any]] = []

    def fake_cleanup(pin_path: Any, netns: Any = None, **_: Any) -> Any:
        calls.append((pin_path, netns))
        return agent.datapath.CleanupResult((("veth1", "ingress"),), ("zm_flows_a",))

    monkeypatch.setattr(agent.datapath.Datapath, "cleanup", staticmethod(fake_cleanup))
    assert cli.main(["agent", "--node-name", "nb", "--cleanup"]) == 0
    assert calls == [("/sys/fs/bpf/zonemeter/nb", None)]
    out = capsys.readouterr().out
    assert '"filters_removed": ["veth1/ingress"]' in out and "zm_flows_a" in out


def test_cleanup_removes_the_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import agent.datapath

    monkeypatch.setattr(agent.datapath.Datapath, "cleanup", staticmethod(
        lambda pin_path, netns=None, **_: agent.datapath.CleanupResult((), ())))
    cp = tmp_path / "cp"
    cp.write_text("{}")
    (tmp_path / "cp.tmp").write_text("{")  # a write a kill -9 cut short
    assert cli.main(["agent", "--node-name", "nb", "--pin-path", "none", "--cleanup",
                     "--checkpoint-path", str(cp)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["checkpoint_removed"] == [str(cp), f"{cp}.tmp"]
    assert list(tmp_path.iterdir()) == []
