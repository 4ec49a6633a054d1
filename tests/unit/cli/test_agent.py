"""zonemeter agent: the interval loop with a fake datapath (deltas in -> exposition text out),
SIGTERM final export, JSON logs, CLI --help and error paths.

The datapath is the only fake: metadata is a real ClusterMetadata loaded from API-shaped
objects, hints come from the real evaluate_cluster, attribution and exporter are real.
"""

from __future__ import annotations

import argparse
import io
import ipaddress
import json
import logging
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent import cli
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.logs import JsonFormatter
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import FakeDatapath
from tests.fixtures.topologies import two_zone_cluster, write_snapshot

ip = ipaddress.ip_address


def d(kind: FlowKind, local: str, remote: str, port: int, nbytes: int) -> FlowDelta:
    return FlowDelta(kind, ip(local), ip(remote), port, 6, nbytes, 1)


# node nb: endpoints web-b 10.244.2.20:8080, db-b 10.244.2.30:5432; client-b 10.244.2.10
DELTAS = [
    d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.10", 8080, 600),     # client-a -> web-b
    d(FlowKind.RESPONSE, "10.244.2.20", "10.244.1.10", 8080, 4000),
    d(FlowKind.REQUEST, "10.244.2.30", "10.244.2.10", 5432, 100),     # client-b -> db-b
    d(FlowKind.EGRESS, "10.244.2.10", "10.96.0.10", 80, 700),         # client-side copy
    d(FlowKind.EGRESS, "10.244.2.10", "93.184.216.34", 443, 50),      # to the internet
    d(FlowKind.INGRESS, "10.244.2.10", "93.184.216.34", 443, 80),
    d(FlowKind.INGRESS, "10.244.2.10", "10.244.1.10", 0, 30),         # client-a's egress
]

EXPECTED = (Path(__file__).parent / "agent_expected.txt")


def make_loop(node: str = "nb") -> tuple[AgentLoop, FakeDatapath, Exporter, ClusterMetadata]:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    dp = FakeDatapath()
    exp = Exporter(version="t")
    perf = iter([10.0, 10.25, 20.0, 20.5, 30.0, 30.5])
    clock = iter([1000.0, 1010.0, 1020.0])
    loop = AgentLoop(node, dp, cache, HintModel(cache), exp, interval=10,
                     clock=lambda: next(clock), perf=lambda: next(perf))
    return loop, dp, exp, cache


def test_one_interval_deltas_in_exposition_out() -> None:
    loop, dp, exp, _ = make_loop()
    dp.pending = list(DELTAS)
    res = loop.tick()
    assert (res.deltas, res.bytes, res.services_evaluated, res.endpoints_changed) == (7, 5560, 2, True)
    assert dp.endpoints == [frozenset({(ip("10.244.2.20"), 8080, 6), (ip("10.244.2.30"), 5432, 6)})]
    assert generate_latest(exp.registry()).decode() == EXPECTED.read_text()


def test_counters_are_cumulative_and_endpoints_follow_slices() -> None:
    loop, dp, exp, cache = make_loop()
    dp.pending = list(DELTAS)
    loop.tick()
    # web-b leaves the slice: the kernel's endpoint set shrinks, web is re-evaluated alone
    c = two_zone_cluster()
    web = c["endpointslices"][0]
    web["endpoints"] = web["endpoints"][:1]
    cache.apply("endpointslices", "MODIFIED", web)
    dp.pending = [d(FlowKind.REQUEST, "10.244.2.30", "10.244.2.10", 5432, 11)]
    res = loop.tick()
    assert res.endpoints_changed and res.services_evaluated == 1
    assert dp.endpoints[-1] == frozenset({(ip("10.244.2.30"), 5432, 6)})
    text = generate_latest(exp.registry()).decode()
    assert ('zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-b",crossing="same_node",'
            'direction="request",lb_type="none",namespace="shop",port="5432",server_zone="zone-b",'
            'service="db"} 111.0') in text
    assert "zonemeter_collector_duration_seconds 0.5" in text
    # nothing changed: no endpoint rewrite, no hint evaluation
    res = loop.tick()
    assert not res.endpoints_changed and res.services_evaluated == 0 and len(dp.endpoints) == 2


def test_entry_points_follow_services_and_nodes() -> None:
    """The loop writes the node's entries of the first hop of node ports
    (ClusterMetadata.entry_points): its addresses with the node ports of Services with
    externalTrafficPolicy Cluster, and their LoadBalancer IPs and externalIPs with the
    Service port; Local Services none; rewritten only when they change."""
    loop, dp, _, cache = make_loop()
    loop.tick()
    assert dp.entries == [frozenset()]  # ClusterIP Services only
    cache.apply("services", "ADDED", k8s.service(
        "shop-lb", cluster_ip="10.96.0.30", stype="LoadBalancer", load_balancer_ips=["203.0.113.9"],
        external_ips=["198.51.100.4"], ports=[k8s.http_port(80, 8080, node_port=30080)]))
    cache.apply("services", "ADDED", k8s.service(
        "shop-local", cluster_ip="10.96.0.31", stype="LoadBalancer", load_balancer_ips=["203.0.113.10"],
        external_traffic_policy="Local", ports=[k8s.http_port(80, 8080, node_port=30081)]))
    loop.tick()
    assert dp.entries[-1] == frozenset({(ip("10.1.0.2"), 30080, 6), (ip("203.0.113.9"), 80, 6),
                                        (ip("198.51.100.4"), 80, 6)})
    loop.tick()
    assert len(dp.entries) == 2


def test_a_failing_drain_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    loop, dp, exp, _ = make_loop()
    dp.fail_next_drain = True
    dp.pending = list(DELTAS)
    with caplog.at_level(logging.ERROR):
        res = loop.tick()
    assert res.deltas == 0 and "drain failed" in caplog.text
    assert exp.snapshot().generated_at == 1000.0  # exported anyway
    res = loop.tick()  # the bytes were not lost: the next drain gets them
    assert res.bytes == 5560
    assert sum(exp.snapshot().totals.service_bytes.values()) == 4700


def test_json_formatter_one_object_per_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    lg = logging.getLogger("zonemeter.test")
    lg.addHandler(handler)
    try:
        lg.warning("hello\nworld", extra={"fields": {"node": "nb"}})
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            lg.error("failed", exc_info=True)
    finally:
        lg.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(x) for x in lines)
    assert (first["level"], first["msg"], first["node"]) == ("warning", "hello\nworld", "nb")
    assert second["error"] == "ValueError: bad thing"


# ----------------------------------------------------------------------------- run() + SIGTERM


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_detaches_then_drains_and_exports_the_last_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import agent.datapath

    made: list[FakeDatapath] = []

    def factory(config: Any) -> FakeDatapath:
        made.append(FakeDatapath(config))
        return made[-1]

    monkeypatch.setattr(agent.datapath, "Datapath", factory)
    snap = write_snapshot(tmp_path / "cluster.json")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, str] = {}

    def driver() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # wait for the first export
            try:
                if urllib.request.urlopen(url + "/readyz", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        made[0].pending = list(DELTAS)  # counted after the last interval tick
        # delivered to this (non-main) thread: the agent must still wake at once, not at
        # the end of its 60 s interval
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        while time.monotonic() < deadline:  # scrape during the linger
            try:
                text = urllib.request.urlopen(url + "/metrics", timeout=1).read().decode()
            except OSError:
                time.sleep(0.05)
                continue
            if "zonemeter_service_bytes_total{" in text:
                seen["text"] = text
                return
            time.sleep(0.05)

    th = threading.Thread(target=driver)
    th.start()
    started = time.monotonic()
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", str(snap), "--metrics-address",
                   f"127.0.0.1:{port}", "--interval", "60", "--final-linger-seconds", "3",
                   "--exclude-interfaces", "zmu*,zmx*", "--flow-capacity", "1024", "--attach", "clsact"])
    th.join()
    assert rc == 0
    assert time.monotonic() - started < 30  # woke on the signal, not after the interval
    dp = made[0]
    assert dp.config.exclude_patterns == ("zmu*", "zmx*") and dp.config.flow_capacity == 1024
    assert dp.config.attach == "clsact"
    assert dp.events[:3] == ["watch", "drain", "close"] and dp.events[3] == "drain"
    text = seen["text"]
    assert ('zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-a",crossing="cross_zone",'
            'direction="response",lb_type="none",namespace="shop",port="80",server_zone="zone-b",'
            'service="web"} 4000.0') in text
    err = capsys.readouterr().err.splitlines()
    logs = [json.loads(x) for x in err]  # every stderr line is one JSON object
    msgs = [x["msg"] for x in logs]
    assert "final export" in msgs and msgs[-1] == "stopped"
    final = next(x for x in logs if x["msg"] == "final export")
    assert (final["deltas"], final["bytes"]) == (7, 5560)
    with pytest.raises(OSError):  # the port is released after the linger
        urllib.request.urlopen(url + "/healthz", timeout=1)


def test_a_stop_before_attaching_drains_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while the agent still waits for its metadata (a restart during an API
    outage): it exits without attaching and without a drain, which would have attributed
    with an empty cache (every Service byte endpoint_without_service); pinned programs keep
    counting for the next agent."""
    import agent.cli.agent as cli_agent
    import agent.datapath

    made: list[FakeDatapath] = []

    def factory(config: Any) -> FakeDatapath:
        made.append(FakeDatapath(config))
        return made[-1]

    def wait_and_stop(cache: Any, stop: Any, timeout: float) -> None:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        assert stop.wait(5)

    monkeypatch.setattr(agent.datapath, "Datapath", factory)
    monkeypatch.setattr(cli_agent, "_wait_synced", wait_and_stop)
    snap = write_snapshot(tmp_path / "cluster.json")
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", str(snap), "--metrics-address",
                   f"127.0.0.1:{_free_port()}", "--interval", "60", "--pin-path", "none",
                   "--checkpoint-path", str(tmp_path / "cp")])
    assert rc == 0
    assert made[0].events == ["release", "close"]  # no watch (attach), no drain
    msgs = [json.loads(x)["msg"] for x in capsys.readouterr().err.splitlines()]
    assert "stopped before attaching: nothing drained" in msgs
    assert not (tmp_path / "cp").exists()  # nothing new to checkpoint either


# ----------------------------------------------------------------------------- CLI


def test_help_lists_the_contract_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["agent", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--node-name", "--snapshot", "--kubeconfig", "--netns", "--metrics-address",
                 "--interval", "--zone-cidrs", "--exclude-interfaces", "--interface-patterns",
                 "--kubernetes-version", "--kube-proxy-version", "--feature-gates", "--flow-capacity",
                 "--log-level", "--locality-replicas", "--pod-name", "--pod-namespace",
                 "--pod-scope", "--pod-cidrs",
                 "--final-linger-seconds", "--uplink-interfaces", "--entry-hops", "0.0.0.0:11808"):
        assert flag in out


@pytest.mark.parametrize("extra, message", [
    ([], "--node-name: required (or set NODE_NAME)"),
    (["--node-name", "nb", "--interval", "0"], "--interval: must be > 0, got 0"),
    (["--node-name", "nb", "--metrics-address", "localhost"], "--metrics-address: expected HOST:PORT"),
    (["--node-name", "nb", "--final-linger-seconds", "-1"], "--final-linger-seconds: must be >= 0"),
    (["--node-name", "nb", "--netns", "zm-no-such-ns-0000"], "no network namespace /run/netns/zm-no-such-ns-0000"),
    (["--node-name", "nb", "--feature-gates", "Foo"], "--feature-gates: expected Name=true|false"),
    (["--node-name", "nb", "--snapshot", "/nonexistent/x.json"], "/nonexistent/x.json: cannot read"),
    (["--node-name", "nx", "SNAP"], "node 'nx' is not in the snapshot"),
    (["--node-name", "nb", "SNAP", "--kubernetes-version", "1.2"], "--kubernetes-version"),
    (["--node-name", "nb", "SNAP", "--kube-proxy-version", "1.99"], "--kube-proxy-version: expected auto"),
    (["--node-name", "nb", "SNAP", "--flow-capacity", "3"], "flow_capacity: must be within"),
    (["--node-name", "nb", "SNAP", "--pod-cidrs", "10.0.0.0/8,10.0.0.1/8"],
     "--pod-cidrs: not a network: 10.0.0.1/8 has host bits set"),
    (["--node-name", "nb", "BARE", "--pod-scope", "node"],
     "--pod-scope node: no pod range: no Node declares spec.podCIDRs and no --pod-cidrs is given"),
])
def test_bad_input_is_one_line_and_exit_2(extra: list[str], message: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    snap = str(write_snapshot(tmp_path / "c.json"))
    bare = two_zone_cluster()  # Nodes without spec.podCIDRs, as a VPC CNI's
    for n in bare["nodes"]:
        n["spec"] = {}
    bare_snap = str(write_snapshot(tmp_path / "bare.json", bare))
    argv = ["agent"] + [x for e in extra for x in (["--snapshot", snap] if e == "SNAP" else
                                                   ["--snapshot", bare_snap] if e == "BARE" else [e])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_bad_version_json_beside_the_snapshot_is_exit_2(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(write_snapshot(tmp_path / "c.json"))
    (tmp_path / "version.json").write_text("{not json")
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", snap])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "version.json: cannot read" in err, err


@pytest.mark.parametrize(("flag", "server", "want"), [
    (None, None, ("1.37", "default")),
    (None, "v1.33.5-eks-abc", ("1.33", "snapshot")),
    (None, "v1.38.0", ("1.37", "snapshot")),
    ("1.31", "v1.33.5", ("1.31", "flag")),
])
def test_model_version_from_the_snapshot_version_json(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, flag: str | None, server: str | None,
        want: tuple[str, str]) -> None:
    from agent.cli.agent import model_version

    snap = write_snapshot(tmp_path / "c.json")
    if server is not None:
        (tmp_path / "version.json").write_text(json.dumps(
            {"clientVersion": {"gitVersion": "v1.35.0"}, "serverVersion": {"gitVersion": server}}))
    args = argparse.Namespace(kubernetes_version=flag, snapshot=str(snap))
    with caplog.at_level(logging.WARNING):
        assert model_version(args, None) == want
    said = [r.getMessage() for r in caplog.records]
    assert said == (["the snapshot's version.json reports Kubernetes v1.38.0, newer than the hint "
                     "model covers (1.27 to 1.37): modelling it as 1.37"] if server == "v1.38.0" else [])


def test_bad_snapshot_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "List", "items": [{"kind": "Pod", "metadata": 5}]}')
    rc = cli.main(["agent", "--node-name", "nb", "--snapshot", str(bad)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(bad) in err, err


def test_node_name_defaults_to_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    args = cli.build_parser().parse_args(["agent"])
    assert isinstance(args, argparse.Namespace) and args.node_name == "from-env"
    assert (args.metrics_address, args.interval, args.final_linger_seconds) == ("0.0.0.0:11808", 10.0, 0.0)


def test_metrics_port_in_use_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    snap = str(write_snapshot(tmp_path / "c.json"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = cli.main(["agent", "--node-name", "nb", "--snapshot", snap,
                       "--metrics-address", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("zonemeter: error: --metrics-address 127.0.0.1:")
    assert all(json.loads(x) for x in err[:-1])  # anything before it is JSON log lines


def test_flows_pairs_carry_the_service_port() -> None:
    # /flows rows name the Service port like the service series' port label ("" for
    # non-Service traffic); it used to be "" always
    loop, dp, exp, _ = make_loop()
    dp.pending = list(DELTAS)
    loop.tick()
    pairs = exp.flows(top=50)["pairs"]
    assert {(p["service"], p["port"]) for p in pairs} == {("web", "80"), ("db", "5432"), ("", "")}
