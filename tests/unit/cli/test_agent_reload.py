"""zonemeter agent --snapshot FILE follows the file: a rewrite (atomic rename, as the demo
does) is noticed between ticks, the kernel tables are drained with the old metadata first,
then the cache is replaced as a diff (deleted pods to the grace cache, only changed Services
re-evaluated) and the new local endpoints are written to the datapath at once.

The datapath is the fake of test_agent.py; metadata, hints, attribution and exporter are real.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent import cli
from agent.cli.agent import _run
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.source import open_metadata
from agent.loop import AgentLoop
from agent.records import FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import FakeDatapath
from tests.fixtures.topologies import two_zone_cluster
from tests.unit.cli.test_agent import _free_port, d
from tests.unit.cli.test_agent_live import ThreadStopper

ip = ipaddress.ip_address


def owner(cache: Any, address: Any, at: float | None = None) -> str | None:
    rec = cache.pod_at(address, at)
    return None if rec is None else rec.name


def write_atomic(path: Path, objs: dict[str, list[dict[str, Any]]]) -> None:
    items = [o for kind in ("nodes", "pods", "services", "endpointslices") for o in objs[kind]]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    os.replace(tmp, path)


def churned() -> dict[str, list[dict[str, Any]]]:
    """web-b (10.244.2.20, Service web) is gone; cache-b of a new Service ``cache`` (port
    9090) took its address; client-b (10.244.2.10, Deployment client) was replaced by
    client-b2 of Deployment batch, same address."""
    c = two_zone_cluster()
    c["pods"] = [p for p in c["pods"] if p["metadata"]["name"] not in ("web-b", "client-b")]
    c["pods"] += [k8s.pod("cache-b", "10.244.2.20", "nb", app="cache"),
                  k8s.pod("client-b2", "10.244.2.10", "nb", app="batch", template_hash="77aa11",
                          owner=("ReplicaSet", "batch-77aa11"))]
    c["services"].append(k8s.service("cache", cluster_ip="10.96.0.30", ports=[k8s.http_port(80, 9090)]))
    web = c["endpointslices"][0]
    web["endpoints"] = web["endpoints"][:1]
    c["endpointslices"].append(k8s.endpointslice("cache-abcde", "cache", [k8s.endpoint("10.244.2.20", "zone-b", "nb")],
                                                 ports=[{"name": "http", "port": 9090, "protocol": "TCP"}]))
    return c


def _series(text: str, service: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zonemeter_service_bytes_total{")
               and f'service="{service}"' in line)


def _workload(text: str, workload: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zonemeter_workload_bytes_total{")
               and f'workload="{workload}"' in line)


def test_rewrite_drains_with_old_metadata_then_applies_a_diff(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    write_atomic(path, two_zone_cluster())
    source = open_metadata(snapshot=path)
    cache = source.cache
    dp = FakeDatapath()
    exp = Exporter(version="t")
    loop = AgentLoop("nb", dp, cache, HintModel(cache), exp, interval=10)
    loop.tick()
    assert dp.endpoints[-1] == frozenset({(ip("10.244.2.20"), 8080, 6),
                                          (ip("10.244.2.30"), 5432, 6)})
    # unchanged file: nothing happens, not even a drain
    drains = dp.events.count("drain")
    assert loop.poll_metadata(source.poll_snapshot) is False
    assert dp.events.count("drain") == drains

    # bytes the kernel counted before the pods changed, still in the table
    dp.pending = [d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.10", 8080, 500),
                  d(FlowKind.EGRESS, "10.244.2.10", "10.1.0.1", 22, 70)]
    before = time.time()
    write_atomic(path, churned())
    assert loop.poll_metadata(source.poll_snapshot) is True
    after = time.time()
    assert source.reloads == 1
    # drained before the change: web-b's last bytes are web's, client-b's egress is client's
    text = generate_latest(exp.registry()).decode()
    assert _series(text, "web") == 500 and _series(text, "cache") == 0
    assert _workload(text, "client") == 70
    # the new endpoint set went to the datapath at once, without waiting for a tick
    assert dp.endpoints[-1] == frozenset({(ip("10.244.2.20"), 9090, 6),
                                          (ip("10.244.2.30"), 5432, 6)})
    # only the Services that changed were re-evaluated (web lost an endpoint, cache is new;
    # db untouched)
    assert loop.hints.last_evaluated == 2
    assert loop.hints.locality("shop", "cache") is not None
    # the old owners stay resolvable by time (grace cache); the new ones own the IPs now
    assert owner(cache, ip("10.244.2.20"), before) == "web-b"
    assert owner(cache, ip("10.244.2.20"), after + 1) == "cache-b"
    assert owner(cache, ip("10.244.2.10"), before) == "client-b"
    assert owner(cache, ip("10.244.2.10"), after + 1) == "client-b2"

    # bytes counted after the change go to the new owners
    dp.pending = [d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.10", 9090, 300),
                  d(FlowKind.EGRESS, "10.244.2.10", "10.1.0.1", 22, 40)]
    loop.tick()
    text = generate_latest(exp.registry()).decode()
    assert _series(text, "web") == 500 and _series(text, "cache") == 300
    assert _workload(text, "client") == 70 and _workload(text, "batch") == 40


def test_a_malformed_rewrite_keeps_the_old_metadata(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "snap.json"
    write_atomic(path, two_zone_cluster())
    source = open_metadata(snapshot=path)
    loop = AgentLoop("nb", FakeDatapath(), source.cache, HintModel(source.cache), Exporter(),
                     interval=10)
    loop.tick()
    tmp = path.with_name("x.tmp")
    tmp.write_text('{"kind": "List", "items": [{"kind": "Pod"}]}')  # no metadata.name
    os.replace(tmp, path)
    assert loop.poll_metadata(source.poll_snapshot) is False
    assert loop.poll_metadata(source.poll_snapshot) is False  # same bad file: one error
    assert source.reload_errors == 1
    assert sum("snapshot reload failed" in r.getMessage() for r in caplog.records) == 1
    assert owner(source.cache, ip("10.244.2.20")) == "web-b"
    write_atomic(path, churned())
    assert loop.poll_metadata(source.poll_snapshot) is True
    assert owner(source.cache, ip("10.244.2.20")) == "cache-b"


def test_the_running_agent_picks_up_a_rewrite_between_ticks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI path: with a 30 s interval, only the between-ticks poll can bring
    the new endpoints to the datapath within a couple of seconds."""
    import agent.datapath

    path = tmp_path / "snap.json"
    write_atomic(path, two_zone_cluster())
    made: list[FakeDatapath] = []
    monkeypatch.setattr(agent.datapath, "Datapath",
                        lambda config: made.append(FakeDatapath(config)) or made[-1])  # type: ignore[func-returns-value]
    port = _free_port()
    args = cli.build_parser().parse_args([
        "agent", "--node-name", "nb", "--snapshot", str(path),
        "--metrics-address", f"127.0.0.1:{port}", "--interval", "30"])
    stopper = ThreadStopper()
    out: list[int] = []
    th = threading.Thread(target=lambda: out.append(_run(args, stopper)))  # type: ignore[arg-type]
    th.start()
    try:
        deadline = time.monotonic() + 15
        while not (made and made[0].endpoints) and time.monotonic() < deadline:
            time.sleep(0.05)
        dp = made[0]
        dp.pending = [d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.10", 8080, 500)]
        write_atomic(path, churned())
        want = frozenset({(ip("10.244.2.20"), 9090, 6), (ip("10.244.2.30"), 5432, 6)})
        deadline = time.monotonic() + 3
        while dp.endpoints[-1] != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dp.endpoints[-1] == want
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
        assert _series(text, "web") == 500  # exported by the pre-change tick
    finally:
        stopper.event.set()
        th.join(30)
    assert out == [0]


def test_live_cache_drains_when_a_pod_gives_up_its_address() -> None:
    """Live cluster: the watch deletes client-b; within a poll the agent drains, so
    client-b's last bytes are attributed to it (grace cache) before client-b2 takes the
    address; without that drain, the next tick would credit them to client-b2."""
    from agent.cli.agent import release_poll
    from agent.k8s.cache import ClusterMetadata
    from agent.k8s.snapshot import Snapshot

    def run(drain_on_release: bool) -> str:
        c = two_zone_cluster()
        cache = ClusterMetadata()
        cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                     endpointslices=c["endpointslices"], pods=c["pods"]))
        dp = FakeDatapath()
        exp = Exporter(version="t")
        loop = AgentLoop("nb", dp, cache, HintModel(cache), exp, interval=10)
        poll = release_poll(cache)
        loop.tick()
        assert loop.poll_metadata(poll) is False  # nothing released yet: no extra tick
        dp.pending = [d(FlowKind.EGRESS, "10.244.2.10", "10.1.0.1", 22, 70)]  # client-b
        time.sleep(0.01)
        cache.apply("pods", "DELETED", next(p for p in c["pods"]
                                            if p["metadata"]["name"] == "client-b"))
        if drain_on_release:
            assert loop.poll_metadata(poll) is True
        time.sleep(0.01)
        cache.apply("pods", "ADDED", k8s.pod("client-b2", "10.244.2.10", "nb", app="batch", template_hash="77aa11",
                                             owner=("ReplicaSet", "batch-77aa11")))
        loop.tick()
        dp.pending = [d(FlowKind.EGRESS, "10.244.2.10", "10.1.0.1", 22, 40)]  # client-b2
        loop.tick()
        return generate_latest(exp.registry()).decode()

    text = run(True)
    assert _workload(text, "client") == 70 and _workload(text, "batch") == 40
    text = run(False)  # the imprecision the release poll removes
    assert _workload(text, "client") == 0 and _workload(text, "batch") == 110
