"""Attacks on ``zonemeter agent`` flags and ``--cleanup`` (bad input and restart).

The datapath is replaced by a stub that refuses to load (exit 1), so a flag that slips
through validation shows up as exit 1 instead of the one-line exit 2, and no test here
loads BPF or touches an interface.
"""

from __future__ import annotations

import argparse
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

import agent.datapath
from agent import cli
from agent.errors import RuntimeFailure
from tests.fixtures.topologies import write_snapshot


@pytest.fixture()
def no_datapath(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: Any) -> Any:
        raise RuntimeFailure("test: the datapath was reached")

    monkeypatch.setattr(agent.datapath, "Datapath", refuse)


@pytest.mark.parametrize("flag", ["--interval", "--final-linger-seconds",
                                  "--hold-unresolved-seconds", "--sync-timeout-seconds"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300"])
def test_seconds_flags_must_be_finite(flag: str, value: str, tmp_path: Path, no_datapath: None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """NaN passed every ``< 0`` check: ``--hold-unresolved-seconds nan`` held unresolved
    bytes forever (the final flush could not release them either: never exported),
    ``--final-linger-seconds inf``/``nan`` made ``time.sleep`` raise after the final
    export (a traceback and exit 1 instead of 0), ``--interval inf`` exported once."""
    snap = str(write_snapshot(tmp_path / "c.json"))
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", snap, "--metrics-address",
                   "127.0.0.1:0", "--sync-timeout-seconds=0", f"{flag}={value}"])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if not x.startswith('{"ts"')]
    assert rc == 2 and len(lines) == 1 and flag in lines[0], err


@pytest.mark.parametrize("netns", [".", ".."])
def test_netns_dot_names_are_refused(netns: str, no_datapath: None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``/run/netns/..`` exists (it is ``/run``), so ``--netns ..`` passed the existence
    check and reached the datapath as a namespace name."""
    rc = cli.main(["agent", "--node-name", "nb", "--netns", netns])
    err = capsys.readouterr().err
    assert rc == 2 and "--netns" in err and len(err.strip().splitlines()) == 1, err


def _fake_cleanup(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    def fake(pin_path: Any, netns: Any = None, **_: Any) -> Any:
        # is the pin lock held while cleanup removes things? (another fd must not get it)
        fd = os.open(pin_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = False
        except BlockingIOError:
            locked = True
        finally:
            os.close(fd)
        seen.append((pin_path, netns, locked))
        return agent.datapath.CleanupResult((), ())

    monkeypatch.setattr(agent.datapath.Datapath, "cleanup", staticmethod(fake))


def test_cleanup_refuses_while_an_agent_holds_the_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A running agent holds the flock on its pin directory for its lifetime (a second
    agent waits for it). ``--cleanup`` used to ignore it and remove the running agent's
    tc filters and pins: that agent then exported zeros while reporting itself attached."""
    pins = tmp_path / "pins"
    pins.mkdir()
    seen: list[Any] = []
    _fake_cleanup(monkeypatch, seen)
    running = agent.datapath.lock_pins(str(pins), 0.0)  # what a running agent holds
    try:
        rc = cli.main(["agent", "--cleanup", "--pin-path", str(pins)])
        err = capsys.readouterr().err
        assert rc == 1 and "agent is running" in err and str(pins) in err, err
        assert seen == []
    finally:
        os.close(running)
    # the agent exited: cleanup goes ahead, holding the lock so no agent starts meanwhile
    assert cli.main(["agent", "--cleanup", "--pin-path", str(pins)]) == 0
    assert seen == [(str(pins), None, True)]
    # and it released the lock afterwards
    fd = agent.datapath.lock_pins(str(pins), 0.0)
    os.close(fd)


def test_cleanup_without_a_pin_directory_still_removes_filters(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake(pin_path: Any, netns: Any = None, **_: Any) -> Any:
        seen.append(pin_path)
        return agent.datapath.CleanupResult((), ())

    monkeypatch.setattr(agent.datapath.Datapath, "cleanup", staticmethod(fake))
    gone = str(tmp_path / "never-created")
    assert cli.main(["agent", "--cleanup", "--pin-path", gone]) == 0
    assert seen == [gone]


@pytest.mark.parametrize("argv, flag", [
    (["--hints-populated", "web"], "--hints-populated"),           # no namespace
    (["--hints-populated", "shop/web,db"], "--hints-populated"),   # one good, one not
    (["--hints-populated", "a/b/c"], "--hints-populated"),
    (["--hints-populated", "/web"], "--hints-populated"),
    (["--context", "prod"], "--context"),                         # ignored with --snapshot
])
def test_explain_flags_that_were_silently_ignored(argv: list[str], flag: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--hints-populated web`` (no namespace) matched no Service and was dropped without
    a word, so the diagnosis silently assumed the controller had not populated hints;
    ``--context`` with ``--snapshot`` was ignored the same way."""
    snap = str(write_snapshot(tmp_path / "c.json"))
    rc = cli.main(["explain", "--snapshot", snap, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and len(err.strip().splitlines()) == 1, err


def test_explain_hints_populated_accepts_namespace_name_lists(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(write_snapshot(tmp_path / "c.json"))
    assert cli.main(["explain", "--snapshot", snap, "--hints-populated", " shop/web , shop/db ,"]) == 0
    assert "shop/web" in capsys.readouterr().out


def test_a_node_name_the_cluster_does_not_know_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """Live cluster: ``--node-name`` set to the host name instead of the Node's name ran
    silently: no local endpoints (Service bytes counted as workload bytes), every zone of
    the node unknown. The agent now says so once the Nodes are listed."""
    import logging

    from agent.cli.agent import warn_unknown_node
    from agent.k8s.cache import ClusterMetadata
    from tests.fixtures.topologies import two_zone_cluster

    cache = ClusterMetadata()
    with caplog.at_level(logging.WARNING, logger="agent.cli.agent"):
        assert not warn_unknown_node(cache, "na.ec2.internal")  # not listed yet: no verdict
        cache.replace("nodes", two_zone_cluster()["nodes"])
        cache.set_synced("nodes", True)
        assert not warn_unknown_node(cache, "na")
        assert warn_unknown_node(cache, "na.ec2.internal")
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "'na.ec2.internal' is not among the cluster's Nodes" in msgs[0]


def test_endpoints_are_not_overwritten_before_the_slices_were_ever_listed() -> None:
    """Restart with pinned maps while the API is down: after --sync-timeout-seconds the
    agent attached and wrote the cache's endpoint set, which is empty (or the first page
    of a list that failed), over the previous agent's set still in the pinned map. Until
    the API came back, this node's Service bytes were counted as workload bytes."""
    from agent.exporter import Exporter
    from agent.hints import HintModel
    from agent.k8s.cache import ClusterMetadata
    from agent.loop import AgentLoop
    from tests.fixtures.fakes import FakeDatapath
    from tests.fixtures.topologies import two_zone_cluster

    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.replace("nodes", c["nodes"])
    cache.set_synced("nodes", True)
    cache.replace("endpointslices", c["endpointslices"][:1])  # a list that failed half way
    dp = FakeDatapath()
    loop = AgentLoop("nb", dp, cache, HintModel(cache), Exporter(version="t"), interval=10,
                     clock=lambda: 1000.0)
    assert loop.sync_endpoints() is False
    loop.tick()
    assert dp.endpoints == [] and dp.service_ports == []  # the kernel keeps what it has
    cache.replace("endpointslices", c["endpointslices"])  # the list completes
    cache.set_synced("endpointslices", True)
    loop.tick()
    assert len(dp.endpoints) == 1 and len(dp.endpoints[0]) == 2  # web-b and db-b on nb
    # with them, the cluster's Service ports (ZM_PORT_SERVICE), written once
    assert dp.service_ports == [cache.service_ports()] and cache.service_ports()
    cache.set_synced("endpointslices", False)  # a later outage: the cache keeps its objects
    cache.replace("endpointslices", c["endpointslices"][1:])  # ... and what it last heard
    loop.tick()
    assert len(dp.endpoints) == 2 and len(dp.endpoints[-1]) == 1


@pytest.mark.parametrize("env, expect", [
    ({"POD_NAME": "zonemeter-agent-x7k2p", "POD_NAMESPACE": "zonemeter"},
     ("zonemeter", "zonemeter-agent-x7k2p")),
    ({"POD_NAME": "zonemeter-agent-x7k2p"}, None),  # the ring then holds every Node
    ({"POD_NAME": "", "POD_NAMESPACE": "zonemeter"}, None),
    ({}, None),
])
def test_the_agent_finds_its_own_pod_from_the_downward_api(
        env: dict[str, str], expect: tuple[str, str] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli import agent as agent_cli

    for k in ("POD_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers())
    args = parser.parse_args(["agent", "--node-name", "n1"])
    assert agent_cli.agent_pod(args) == expect


def test_new_service_ports_reach_the_datapath_within_a_second() -> None:
    """A Service port the watch delivers between ticks is written by the polls between
    ticks (at most once a second: a recount costs milliseconds at 10,000 Services), not
    at the next interval: only then does the kernel keep it for a late UDP endpoint
    (docs/datapath.md, "Late endpoints")."""
    from agent.exporter import Exporter
    from agent.hints import HintModel
    from agent.k8s.cache import ClusterMetadata
    from agent.loop import AgentLoop
    from tests.fixtures import k8s
    from tests.fixtures.fakes import Clock, FakeDatapath
    from tests.fixtures.topologies import two_zone_cluster

    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.replace("nodes", c["nodes"])
    cache.replace("endpointslices", c["endpointslices"])
    cache.set_synced("endpointslices", True)
    dp = FakeDatapath()
    mono = Clock()
    loop = AgentLoop("nb", dp, cache, HintModel(cache), Exporter(version="t"), interval=10,
                     clock=lambda: 1000.0, monotonic=mono)
    loop.tick()
    assert loop.poll_metadata(lambda before_apply: False) is False
    assert len(dp.service_ports) == 1 and 40000 not in dp.service_ports[0]
    cache.apply("services", "ADDED", k8s.service("media", "shop", ports=[
        {"name": "rtp", "port": 40000, "targetPort": 40000, "protocol": "UDP"}], selector={}))
    mono.t += 0.25
    loop.poll_metadata(lambda before_apply: False)  # within the second: not recounted
    assert len(dp.service_ports) == 1
    mono.t += 0.75
    assert loop.poll_metadata(lambda before_apply: False) is False  # no tick, no reload
    assert len(dp.service_ports) == 2 and 40000 in dp.service_ports[-1]
    assert dp.events.count("drain") == 1
