"""The agent's checkpoint (agent/checkpoint.py) and how the loop uses it: totals survive a
restart, a drained table is emptied only after the checkpoint that includes it, and a
corrupt or foreign file is one log line and a counted fresh start, never an exception.

The kernel half (tables, markers, real kill -9) is tests/kernel/test_agent_restart.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent import checkpoint as cpm
from agent.checkpoint import Checkpointer
from agent.datapath import HandOver
from agent.datapath.abi import LAYOUT_VERSION
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures.fakes import FakeDatapath
from tests.fixtures.topologies import two_zone_cluster
from tests.unit.cli.test_agent import DELTAS, d


class HandOverDatapath(FakeDatapath):
    """FakeDatapath with the hand-over verbs of agent.datapath.Datapath: records calls."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed: list[HandOver | None] = []
        self.commits = 0
        self.folded = (0, 0)

    def resume(self, handover: HandOver | None) -> None:
        self.events.append("resume")
        self.resumed.append(handover)

    def handover(self) -> HandOver:
        return HandOver(77, self.folded)

    def commit(self) -> bool:
        self.events.append("commit")
        self.commits += 1
        return True


def _loop(path: Path, dp: Any, node: str = "nb", hold: float = 0.0
          ) -> tuple[AgentLoop, Exporter, Checkpointer]:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    exp = Exporter(version="t")
    cp = Checkpointer(str(path), node, LAYOUT_VERSION)
    restore = cp.load()
    loop = AgentLoop(node, dp, cache, HintModel(cache), exp, interval=10,
                     hold_unresolved_seconds=hold, checkpoint=cp, restore=restore)
    return loop, exp, cp


def _counters(exp: Exporter) -> dict[str, float]:
    """Every ``*_bytes_total`` sample line of the exposition, by its text before the value."""
    out = {}
    for line in generate_latest(exp.registry()).decode().splitlines():
        if line.startswith("zonemeter_") and "_bytes_total" in line.split("{")[0]:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_counters_resume_from_the_checkpoint_without_a_reset(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    loop, exp, _ = _loop(path, HandOverDatapath())
    loop.datapath.pending = list(DELTAS)  # type: ignore[attr-defined]
    loop.tick()
    first = _counters(exp)
    assert sum(first.values()) > 0
    # a new process: same file, nothing drained yet: the counters are where they were
    dp2 = HandOverDatapath()
    loop2, exp2, cp2 = _loop(path, dp2)
    loop2.tick()
    assert _counters(exp2) == first
    assert dp2.resumed == [HandOver(77, (0, 0))]
    assert cp2.seq == 2
    # and they keep growing from there
    dp2.pending = list(DELTAS)
    loop2.tick()
    assert all(v == 2 * first[k] for k, v in _counters(exp2).items())


def test_hook_coverage_counters_resume_too(tmp_path: Path) -> None:
    """zonemeter_hook_*_total are in the checkpoint as well: a restarted agent's first
    export has them where the previous one left them (they used to restart at 0)."""
    from types import SimpleNamespace

    path = tmp_path / "cp"
    veth = {5: SimpleNamespace(rx_bytes=90_000, rx_packets=100, tx_bytes=190_000, tx_packets=200)}
    loop, exp, _ = _loop(path, HandOverDatapath())
    loop.datapath.pending = list(DELTAS)  # type: ignore[attr-defined]
    loop.datapath.interfaces = veth  # type: ignore[attr-defined]
    loop.tick()
    hook = {k: v for k, v in _counters(exp).items()
            if k.startswith(("zonemeter_hook_", "zonemeter_interface_"))}
    assert len(hook) == 3 and all(v > 0 for v in hook.values()), hook
    loop2, exp2, _ = _loop(path, HandOverDatapath())
    loop2.tick()
    assert {k: v for k, v in _counters(exp2).items() if k in hook} == hook


def test_a_restart_before_the_first_list_leaves_the_kernel_counting(tmp_path: Path) -> None:
    """A restarted agent whose metadata was never listed (API down) does not drain: with an
    empty cache every Service byte would be endpoint_without_service. The kernel keeps the
    bytes; the first tick after the list drains them; without a list the wait ends after
    hold_unresolved_seconds."""
    from tests.fixtures.fakes import Clock

    c = two_zone_cluster()
    for listed_after in (True, False):
        cache = ClusterMetadata()  # nothing listed yet
        dp = HandOverDatapath()
        dp.pending = list(DELTAS)
        mono = Clock()
        cp = Checkpointer(str(tmp_path / f"cp-{listed_after}"), "nb", LAYOUT_VERSION)
        loop = AgentLoop("nb", dp, cache, HintModel(cache), Exporter(version="t"), interval=10,
                         hold_unresolved_seconds=60, checkpoint=cp, restore=cp.load(),
                         monotonic=mono)
        loop.tick()
        mono.t += 30
        loop.tick()
        assert "drain" not in dp.events and dp.pending  # the kernel keeps them
        if listed_after:
            cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                         endpointslices=c["endpointslices"], pods=c["pods"]))
        else:
            mono.t += 31  # waited hold_unresolved_seconds: attribute with what there is
        loop.tick()
        assert dp.events.count("drain") == 1 and not dp.pending
        t = loop.attributor.totals()
        if listed_after:
            assert sum(t.service_bytes.values()) > 0
            assert not t.unattributed_bytes.get("endpoint_without_service")
        else:
            assert t.unattributed_bytes.get("endpoint_without_service", 0) > 0


def test_the_drained_table_is_emptied_only_after_the_checkpoint(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cp"
    dp = HandOverDatapath()
    loop, _, cp = _loop(path, dp)
    order: list[str] = []
    real_save = cp.save

    def save(*args: Any) -> None:
        order.append("save")
        real_save(*args)

    monkeypatch.setattr(cp, "save", save)
    monkeypatch.setattr(dp, "commit", lambda: order.append("commit") or True)
    dp.pending = list(DELTAS)
    loop.tick()
    assert order == ["save", "commit"]


def test_a_failed_checkpoint_keeps_the_table_until_one_succeeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dp = HandOverDatapath()
    loop, _, cp = _loop(tmp_path / "cp", dp)
    real_save = cp.save
    monkeypatch.setattr(cp, "save", lambda *a: (_ for _ in ()).throw(
        cpm.RuntimeFailure("cannot write checkpoint: [Errno 28] No space left on device")))
    dp.pending = list(DELTAS)
    with caplog.at_level(logging.ERROR):
        loop.tick()
        loop.tick()
    assert dp.commits == 0  # never emptied while its bytes are not durable
    assert len([r for r in caplog.records if "checkpoint failed" in r.getMessage()]) == 1
    monkeypatch.setattr(cp, "save", real_save)
    loop.tick()
    assert dp.commits == 2  # the retry at the start of the tick, then this tick's drain
    assert json.loads((tmp_path / "cp").read_text())["attribution"]["bytes_seen"] == \
        sum(x.bytes for x in DELTAS)


def test_held_deltas_survive_a_restart_and_are_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    dp = HandOverDatapath()
    loop, _, _ = _loop(path, dp, hold=60.0)
    unknown_pod = d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.99", 8080, 1234)  # client unknown
    dp.pending = [unknown_pod]
    loop.tick()
    assert loop.attributor.totals().held_bytes == 1234
    assert loop.flush_held() == 0  # with a checkpoint the held deltas stay held ...
    loop2, _, _ = _loop(path, HandOverDatapath(), hold=60.0)
    t = loop2.attributor.totals()
    assert t.held_bytes == 1234 and t.bytes_seen == 1234  # ... and come back held
    loop2.attributor.attribute((), 10**10)  # far past the hold: counted now, once
    t = loop2.attributor.totals()
    assert t.held_bytes == 0
    assert sum(t.service_bytes.values()) == 1234


def _write(path: Path, **changes: Any) -> None:
    doc = {"format": cpm.FORMAT, "version": cpm.VERSION, "layout": LAYOUT_VERSION, "node": "nb",
           "seq": 3, "written_at": 1.0, "handover": {"pins_id": 5, "folded": [1, 2]},
           "discarded": {}, "attribution": {}}
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("content", "reason"), [
    (b"\x00\xff not json", "corrupt"),
    (b'{"format": "zonemeter-checkpoint", "version": 1, "lay', "corrupt"),  # torn write
    (b"[]", "corrupt"),
    (b'{"format": "something-else"}', "corrupt"),
    (None, "node"),
    (None, "version"),
    (None, "layout"),
    (None, "handover"),
    (None, "attribution"),
])
def test_a_corrupt_or_foreign_checkpoint_is_one_line_and_a_counted_fresh_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | None, reason: str) -> None:
    path = tmp_path / "cp"
    want = reason
    if content is not None:
        path.write_bytes(content)
    elif reason == "node":
        _write(path, node="na")
    elif reason == "version":
        _write(path, version=cpm.VERSION + 1)
    elif reason == "layout":
        _write(path, layout=LAYOUT_VERSION - 1)
        want = "version"
    elif reason == "handover":
        _write(path, handover={"pins_id": "x", "folded": [1]})
        want = "corrupt"
    else:  # valid envelope, malformed totals: found when the attributor restores them
        _write(path, attribution={"service": [["only", "two"]]})
        want = "corrupt"
    dp = HandOverDatapath()
    with caplog.at_level(logging.WARNING):
        loop, exp, cp = _loop(path, dp)
        dp.pending = list(DELTAS)
        loop.tick()
    lines = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0] and f"({want})" in lines[0], lines
    assert cp.discarded[want] == 1
    text = generate_latest(exp.registry()).decode()
    assert f'zonemeter_checkpoint_discarded_total{{reason="{want}"}} 1.0' in text
    assert dp.resumed == [None]  # the idle table is counted, not assumed folded
    # a fresh start: counters from zero, and the file is now a good checkpoint of this node
    assert loop.attributor.totals().bytes_seen == sum(x.bytes for x in DELTAS)
    assert json.loads(path.read_text())["node"] == "nb"
    # the discard count itself survives the next restart (a counter never goes back)
    _, _, cp2 = _loop(path, HandOverDatapath())
    assert cp2.discarded[want] == 1


def test_an_unreadable_checkpoint_is_discarded(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.mkdir()  # reading a directory fails with EISDIR
    cp = Checkpointer(str(path), "nb", LAYOUT_VERSION)
    assert cp.load() is None and cp.discarded["unreadable"] == 1


def test_save_is_atomic_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "cp"
    cp = Checkpointer(str(path), "nb", LAYOUT_VERSION)
    synced: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cp.save({"bytes_seen": 1}, {"pins_id": 1, "folded": [0, 0]})
    assert synced == [False, True]  # the file before the rename, the directory after
    assert os.listdir(path.parent) == ["cp"]  # no temporary file left
    # a crash before the rename leaves the old checkpoint intact
    monkeypatch.setenv("ZONEMETER_TEST_CRASH_AT", "mid_checkpoint")
    kills: list[int] = []
    monkeypatch.setattr(cpm, "_crash_seen", {})
    monkeypatch.setattr(os, "kill", lambda pid, sig: (kills.append(sig), (_ for _ in ()).throw(
        SystemExit("killed"))))
    with pytest.raises(SystemExit):
        cp.save({"bytes_seen": 2}, None)
    assert kills and json.loads(path.read_text())["attribution"] == {"bytes_seen": 1}
    monkeypatch.delenv("ZONEMETER_TEST_CRASH_AT")
    assert Checkpointer(str(path), "nb", LAYOUT_VERSION).load() is not None


def test_crash_point_fires_at_the_named_point_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    kills: list[tuple[str, int]] = []
    monkeypatch.setattr(cpm, "_crash_seen", {})
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((where[0], sig)))
    monkeypatch.setenv("ZONEMETER_TEST_CRASH_AT", "after_read:3, mid_clear")
    where = [""]
    for point in ("after_read", "mid_clear", "after_read", "after_read", "after_read", "after_clear"):
        where[0] = point
        cpm.crash_point(point)
    assert kills == [("mid_clear", signal.SIGKILL), ("after_read", signal.SIGKILL)]


def test_attributor_state_round_trips(tmp_path: Path) -> None:
    loop, _, _ = _loop(tmp_path / "cp", HandOverDatapath())
    loop.attributor.attribute([*DELTAS, FlowDelta(FlowKind.EGRESS, DELTAS[0].local,
                                                  DELTAS[0].remote, 0, 0, 5, 1, True)], 1000.0)
    state = json.loads(json.dumps(loop.attributor.state()))
    loop2, _, _ = _loop(tmp_path / "other", HandOverDatapath())
    loop2.attributor.restore(state)
    a, b = loop.attributor.totals(), loop2.attributor.totals()
    for field in ("service_bytes", "workload_bytes", "unattributed_bytes", "skipped_bytes",
                  "unknown_crossing_bytes", "diagnostics_bytes", "bytes_seen", "deltas_seen"):
        assert getattr(a, field) == getattr(b, field), field
    with pytest.raises(ValueError, match="attribution state"):
        loop2.attributor.restore({**state, "bytes_seen": -1})
    assert loop2.attributor.totals().bytes_seen == a.bytes_seen  # unchanged on error


def test_checkpoint_path_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from agent.cli.agent import checkpoint_path_for
    from agent.errors import InputError

    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"checkpoint_path": None, "netns": None, **kw})

    assert checkpoint_path_for(args(checkpoint_path="none")) is None
    assert checkpoint_path_for(args(netns="zm-node-a")) is None  # the lab's throw-away nodes
    explicit = tmp_path / "new" / "cp"
    assert checkpoint_path_for(args(checkpoint_path=str(explicit))) == str(explicit)
    assert explicit.parent.is_dir()
    monkeypatch.setattr(cpm, "DEFAULT_CHECKPOINT_PATH", str(tmp_path / "absent" / "cp"))
    monkeypatch.setattr("agent.cli.agent.DEFAULT_CHECKPOINT_PATH", str(tmp_path / "absent" / "cp"))
    assert checkpoint_path_for(args()) is None  # no /var/lib/zonemeter: no checkpoint
    monkeypatch.setattr("agent.cli.agent.DEFAULT_CHECKPOINT_PATH", str(tmp_path / "cp"))
    assert checkpoint_path_for(args()) == str(tmp_path / "cp")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="--checkpoint-path"):
        checkpoint_path_for(args(checkpoint_path=str(tmp_path / "file" / "cp")))


def test_a_restarted_agent_serves_the_checkpointed_counters_from_its_first_scrape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs of ``zonemeter agent --checkpoint-path`` (fake datapath): the second one's
    very first /metrics answer, before it drained anything, has the first run's counters."""
    import signal
    import threading
    import time
    import urllib.request

    import agent.datapath
    from agent import cli
    from tests.fixtures.topologies import write_snapshot
    from tests.unit.cli.test_agent import _free_port

    made: list[HandOverDatapath] = []

    def factory(config: Any) -> HandOverDatapath:
        made.append(HandOverDatapath())
        return made[-1]

    monkeypatch.setattr(agent.datapath, "Datapath", factory)
    snap = write_snapshot(tmp_path / "cluster.json")
    cp = tmp_path / "state" / "cp"
    series = ('zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-a",crossing="cross_zone",'
              'direction="response",lb_type="none",namespace="shop",port="80",server_zone="zone-b",'
              'service="web"} 4000.0')

    def run(feed: bool) -> str:
        port = _free_port()
        first: dict[str, str] = {}

        def driver() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "text" not in first:
                try:
                    first["text"] = urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                except OSError:
                    time.sleep(0.02)
            while time.monotonic() < deadline and not made[-1].events.count("drain"):
                time.sleep(0.02)
            if feed:
                made[-1].pending = list(DELTAS)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        th = threading.Thread(target=driver)
        th.start()
        rc = cli.main(["agent", "--node-name", "nb", "--snapshot", str(snap),
                       "--metrics-address", f"127.0.0.1:{port}", "--interval", "60",
                       "--pin-path", "none", "--checkpoint-path", str(cp)])
        th.join()
        assert rc == 0
        return first["text"]

    assert series not in run(feed=True)  # nothing counted yet; the final tick drains DELTAS
    assert json.loads(cp.read_text())["seq"] >= 2
    assert series in run(feed=False)  # before the second run's first drain
    assert made[-1].resumed == [HandOver(77, (0, 0))]


def test_a_failed_commit_is_retried_before_the_next_drain(tmp_path: Path) -> None:
    dp = HandOverDatapath()
    loop, _, _ = _loop(tmp_path / "cp", dp)
    fails = [True]

    def commit() -> bool:
        dp.events.append("commit")
        if fails.pop(0) if fails else False:
            raise cpm.RuntimeFailure("cannot empty flow cache slot 3: EPERM")
        return True

    dp.commit = commit  # type: ignore[method-assign]
    loop.tick()
    loop.tick()
    assert [e for e in dp.events if e in ("drain", "commit")] == [
        "drain", "commit",            # failed: the table is still pending in the datapath
        "commit", "drain", "commit"]  # retried first (the checkpoint is durable already)
