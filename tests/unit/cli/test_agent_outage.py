"""API outage at agent level: the interval loop (fake datapath) over the
real list+watch against a Kubernetes API served over real HTTP by kmock, whose server is
stopped and started again on the same port.

While the API is down the agent keeps counting and attributing from its cache,
``zonemeter_metadata_synced`` goes to 0 and ``/readyz`` names the stale resources; bytes of a
pod created during the outage are held (``--hold-unresolved-seconds``) and attributed to it
once the agent has listed again; bytes of an address no pod ever gets are counted as
``unknown`` with reason ``no_pod_for_ip`` when the hold expires.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from typing import Any

import kmock as kmock_lib
import pytest
from prometheus_client import generate_latest

from agent import exporter as ex
from agent.hints import HintModel
from agent.k8s.source import open_metadata
from agent.k8s.watch import WatchSettings
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.unit.cli.test_agent import FakeDatapath

pytestmark = pytest.mark.asyncio
ip = ipaddress.ip_address

PODS = kmock_lib.resource("v1/pods")
NODES = kmock_lib.resource("v1/nodes")
SERVICES = kmock_lib.resource("v1/services")
SLICES = kmock_lib.resource("discovery.k8s.io/v1/endpointslices")
FAST = WatchSettings(timeout_seconds=1, read_margin_seconds=0.5, connect_timeout_seconds=1,
                     backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                     unsynced_after_seconds=0.3)
HOLD = 60.0


def seed(km: Any) -> None:
    for res in ("v1/pods", "v1/nodes", "v1/services", "discovery.k8s.io/v1/endpointslices"):
        km.resources[res] = {}
    km.objects[NODES, None, "n1"] = k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"],
                                             region="region-1", noise=True)
    km.objects[NODES, None, "n2"] = k8s.node("n2", "zone-b", internal="192.168.0.2", pod_cidrs=["10.0.2.0/24"],
                                             region="region-1", noise=True)
    km.objects[PODS, "shop", "web-1"] = k8s.pod("web-1", "10.0.1.5", "n1", noise=True)
    km.objects[PODS, "shop", "client-1"] = k8s.pod("client-1", "10.0.2.9", "n2", noise=True)
    km.objects[SERVICES, "shop", "web"] = k8s.service("web", "shop", cluster_ip="10.96.0.10",
                                                      ports=[{"name": "http", "port": 80,
                                                              "targetPort": 8080}], selector={}, noise=True)
    km.objects[SLICES, "shop", "web-abc"] = k8s.endpointslice(
        "web-abc", "web", [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x", target_namespace="y")],
        ports=[{"name": "http", "port": 8080, "protocol": "TCP"}], noise=True)


def req(client: str, nbytes: int) -> FlowDelta:
    """A request from ``client`` to web-1 (10.0.1.5:8080) on node n1."""
    return FlowDelta(FlowKind.REQUEST, ip("10.0.1.5"), ip(client), 8080, 6, nbytes, 1)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(cond):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)


def series(text: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(w in line for w in want))


async def test_api_outage_keeps_counting_holds_unknown_pods_and_recovers(kmock: Any) -> None:
    seed(kmock)
    server = kmock_lib.Server(kmock)
    await server.__aenter__()
    running = True
    port = server.port
    source = open_metadata(host=f"http://127.0.0.1:{port}", watch_settings=FAST)
    cache = source.cache
    dp = FakeDatapath()
    exp = ex.Exporter(version="t")
    now = {"t": 1_700_000_000.0}
    loop = AgentLoop("n1", dp, cache, HintModel(cache), exp, interval=10,
                     clock=lambda: now["t"], hold_unresolved_seconds=HOLD)
    ready = ex.make_readiness(lambda: True, cache.synced)

    def tick(*deltas: FlowDelta, advance: float = 10.0) -> str:
        now["t"] += advance
        dp.pending = list(deltas)
        loop.tick()
        return generate_latest(exp.registry()).decode()

    try:
        await until(lambda: all(cache.synced().values()))
        text = await asyncio.to_thread(tick, req("10.0.2.9", 100))
        assert series(text, "zonemeter_service_bytes_total", crossing="cross_zone") == 100
        assert ready()[0]

        # --- the API goes away; a pod is created meanwhile (the agent cannot see it)
        await server.__aexit__(None, None, None)
        running = False
        kmock.objects[PODS, "shop", "late-1"] = k8s.pod("late-1", "10.0.2.50", "n2", noise=True)
        # each resource's watch notices on its own: wait for the one asserted on
        await until(lambda: not cache.synced()["pods"])
        ok, why = ready()
        assert not ok and "metadata not synced" in why and "pods" in why
        text = await asyncio.to_thread(
            tick, req("10.0.2.9", 200), req("10.0.2.50", 3000), req("10.0.2.77", 40))
        assert 'zonemeter_metadata_synced{resource="pods"} 0.0' in text
        # known client: counted and attributed from the cache as usual
        assert series(text, "zonemeter_service_bytes_total", crossing="cross_zone") == 300
        # unknown addresses: held, in no series yet
        assert loop.attributor.totals().held_bytes == 3040
        assert series(text, "zonemeter_service_bytes_total", crossing="unknown") == 0

        # --- the API comes back on the same port: the agent lists again
        server = kmock_lib.Server(kmock, port=port)
        await server.__aenter__()
        running = True
        await until(lambda: all(cache.synced().values()))
        assert source.watcher is not None and source.watcher.watchers["pods"].stats.relists >= 1
        assert ready()[0]
        text = await asyncio.to_thread(tick)
        assert 'zonemeter_metadata_synced{resource="pods"} 1.0' in text
        # the new pod's bytes, drained during the outage, are its own (zone-b -> zone-a)
        assert series(text, "zonemeter_service_bytes_total", crossing="cross_zone",
                      client_zone="zone-b") == 3300
        assert loop.attributor.totals().held_bytes == 40  # 10.0.2.77: still nobody's

        # --- the hold runs out: counted as unknown, with the reason
        text = await asyncio.to_thread(tick, advance=HOLD)
        assert loop.attributor.totals().held_bytes == 0
        assert series(text, "zonemeter_service_bytes_total", crossing="unknown") == 40
        assert series(text, "zonemeter_unknown_crossing_bytes_total",
                      reason="no_pod_for_ip") == 40
        total = series(text, "zonemeter_service_bytes_total")
        assert total == 100 + 200 + 3000 + 40  # every byte once
    finally:
        await asyncio.to_thread(source.stop)
        if running:  # stopping a stopped server would hide the test's own failure
            await server.__aexit__(None, None, None)


async def test_shutdown_releases_held_bytes(kmock: Any) -> None:
    """SIGTERM path: bytes still held at the final export are counted, not dropped."""
    seed(kmock)
    source = open_metadata(host=str(kmock.url).rstrip("/"), watch_settings=FAST)
    try:
        await until(lambda: all(source.cache.synced().values()))
        dp = FakeDatapath()
        exp = ex.Exporter(version="t")
        loop = AgentLoop("n1", dp, source.cache, HintModel(source.cache), exp, interval=10,
                         hold_unresolved_seconds=HOLD)
        dp.pending = [req("10.0.2.77", 55), req("10.0.2.9", 5)]
        await asyncio.to_thread(loop.tick)
        assert loop.attributor.totals().held_bytes == 55
        assert await asyncio.to_thread(loop.flush_held) == 55
        text = generate_latest(exp.registry()).decode()
        assert series(text, "zonemeter_unknown_crossing_bytes_total", reason="no_pod_for_ip") == 55
        assert series(text, "zonemeter_service_bytes_total") == 60
        assert await asyncio.to_thread(loop.flush_held) == 0
    finally:
        await asyncio.to_thread(source.stop)
