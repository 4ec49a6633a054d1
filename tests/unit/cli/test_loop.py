"""Attack the whole agent loop with odd metadata and churn (bad input, exactly-once).

The loop runs as in production (real cache, hint model, attributor, exporter) over the
agent test cluster with 1-3 values anywhere replaced by odd JSON or deleted, the
metadata reloaded between ticks (a snapshot rewrite: diff load) and unresolved deltas
held. Properties: no stage raises or is logged as failed, every export renders as
Prometheus text and ``/flows`` JSON, no lookup fails
(``attribution_error``), and every byte drained ends in exactly one of the counted
families once the held bytes are flushed.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures.mutation import mutate_once
from tests.fixtures.topologies import two_zone_cluster
from tests.unit.cli.test_agent import FakeDatapath

ip = ipaddress.ip_address

ODD = st.sampled_from([None, "", "x", 0, -1, 1.5, True, [], {}, [None], {"a": 1}, 70000,
                       "10.244.2.20", "fd00::9", "None", "-1", "500m", "zone-a"])
ADDRS = ["10.244.1.10", "10.244.2.10", "10.244.2.20", "10.244.2.30", "10.244.1.20",
         "10.244.2.99", "10.96.0.10", "10.96.0.20", "10.1.0.1", "93.184.216.34", "fd00::9"]
PORTS = [0, 80, 443, 5432, 8080]




@st.composite
def mutated(draw: Any) -> dict[str, list[dict[str, Any]]]:
    c = two_zone_cluster(hinted=draw(st.booleans()))
    # churn: pods replaced by new pods that take their addresses (a rolling update), or
    # two pods swapping addresses
    for i in draw(st.lists(st.integers(0, len(c["pods"]) - 1), max_size=2)):
        c["pods"][i]["metadata"]["name"] += "-" + draw(st.sampled_from(["x1", "x2"]))
    if draw(st.booleans()):
        a, b = c["pods"][0]["status"], c["pods"][3]["status"]
        a["podIP"], b["podIP"], a["podIPs"], b["podIPs"] = b["podIP"], a["podIP"], b["podIPs"], a["podIPs"]
    objs = [o for k in ("nodes", "pods", "services", "endpointslices") for o in c[k]]
    for _ in range(draw(st.integers(0, 3))):
        mutate_once(draw, draw(st.sampled_from(objs)), ODD, skip=("kind", "apiVersion"))
    return c


DELTA = st.builds(lambda kind, local, remote, port, nb, overflow: FlowDelta(
    kind, ip(local), ip(remote), port, 6, nb, 1, overflow) if ip(local).version == ip(remote).version
    else FlowDelta(kind, ip("10.244.2.10"), ip("10.244.1.10"), port, 6, nb, 1, overflow),
    st.sampled_from(list(FlowKind)), st.sampled_from(ADDRS[:6] + ["fd00::9"]), st.sampled_from(ADDRS),
    st.sampled_from(PORTS), st.integers(0, 10**12), st.booleans())


def _snap(c: dict[str, list[dict[str, Any]]]) -> Snapshot:
    return Snapshot(nodes=c["nodes"], services=c["services"], endpointslices=c["endpointslices"],
                    pods=c["pods"])


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(mutated(), st.lists(DELTA, max_size=6)), min_size=1, max_size=4),
       st.sampled_from(["na", "nb"]), st.sampled_from([0.0, 15.0]))
def test_loop_over_odd_metadata_and_churn_conserves_bytes(
        caplog: pytest.LogCaptureFixture, phases: list[tuple[dict[str, Any], list[FlowDelta]]],
        node: str, hold: float) -> None:
    caplog.clear()
    t = [1000.0]
    cache = ClusterMetadata(clock=lambda: t[0])
    cache.load_snapshot(_snap(phases[0][0]))
    dp = FakeDatapath()
    exp = Exporter(version="t")
    loop = AgentLoop(node, dp, cache, HintModel(cache), exp, interval=10,
                     clock=lambda: t[0], hold_unresolved_seconds=hold)
    drained = 0
    with caplog.at_level(logging.ERROR, logger="agent.loop"):
        for i, (objs, deltas) in enumerate(phases):
            if i:
                cache.load_snapshot(_snap(objs), diff=True)  # the snapshot was rewritten
            dp.pending = list(deltas)
            drained += sum(d.bytes for d in deltas)
            loop.tick()
            t[0] += 10.0
            # what a scrape and `zonemeter top` read of every interval's export
            generate_latest(exp.registry())
            json.dumps(exp.flows())
        loop.flush_held()
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures
    tot = loop.attributor.totals()
    assert tot.held_bytes == 0
    assert "attribution_error" not in tot.unattributed_bytes, tot.unattributed_bytes
    assert tot.bytes_seen == drained
    counted = (sum(tot.service_bytes.values()) + sum(tot.workload_bytes.values())
               + sum(tot.unattributed_bytes.values()) + sum(tot.skipped_bytes.values()))
    assert counted == drained


def test_heap_freezer_freezes_after_each_interval_and_collects_all_when_due() -> None:
    import gc

    from agent.loop import HeapFreezer

    now = [0.0]
    c = two_zone_cluster()
    cache = ClusterMetadata(clock=lambda: 1000.0)
    cache.load_snapshot(_snap(c))
    heap = HeapFreezer(full_every=60.0, clock=lambda: now[0])
    loop = AgentLoop("na", FakeDatapath(), cache, HintModel(cache), Exporter(version="t"),
                     interval=10, clock=lambda: 1000.0, heap=heap)
    try:
        gc.unfreeze()
        loop.tick()
        assert gc.get_freeze_count() > 0  # what survived the interval skips collections
        # a reference cycle that became garbage while frozen is reclaimed at the full
        # collection, once it is due
        import weakref

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        ref = weakref.ref(a)
        gc.freeze()
        del a, b
        gc.collect()
        assert ref() is not None  # frozen: no collection sees it
        now[0] = 30.0
        loop.tick()
        assert ref() is not None and heap.full_collections == 0
        now[0] = 61.0
        loop.tick()
        assert ref() is None and heap.full_collections == 1
        assert gc.get_freeze_count() > 0
        # garbage that is a cycle when the interval ends is collected, not frozen
        c1, c2 = Node(), Node()
        c1.other, c2.other = c2, c1  # type: ignore[attr-defined]
        young = weakref.ref(c1)
        del c1, c2
        now[0] = 70.0
        loop.tick()
        assert heap.full_collections == 1 and young() is None
    finally:
        gc.unfreeze()
