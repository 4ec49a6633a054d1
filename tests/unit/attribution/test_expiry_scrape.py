"""Series expiry (``--series-retention``) under any interleaving of traffic,
Service deletion and re-creation, pod deletion, idle time and held deltas
(``hold_unresolved_seconds``), on the real cache, hint model, Attributor and exporter.

After every interval: the node's books balance (expired bytes included); a series still
present never went down; a series that gained bytes within the retention, or whose object
exists, is never dropped; every series the totals hold is exported once with its value."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import Attributor
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s import MetadataAdapter
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import build_snapshot
from agent.records import FlowKind
from tests.fixtures.topologies import two_zone_cluster
from tests.unit.attribution.test_expiry import (
    INTERNET,
    RETENTION,
    STEP,
    T0,
    Clock,
    balanced,
    d,
    db_request,
    web_request,
)

HOLD = 45.0


def ghost_request(n: int) -> Any:  # from an address in na's pod CIDR no pod holds: held
    return d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.99", 8080, n)


def db_egress(n: int) -> Any:  # db-b -> the internet: workload series (StatefulSet-less pod)
    return d(FlowKind.EGRESS, "10.244.2.30", INTERNET, 443, n)


OPS = st.one_of(
    st.tuples(st.just("traffic"), st.sets(st.sampled_from(("web", "db", "ghost", "dbout")), min_size=1),
              st.integers(1, 10**6)),
    st.tuples(st.just("delete"), st.sampled_from(("services/web", "services/db", "pods/db-b")), st.just(0)),
    st.tuples(st.just("create"), st.sampled_from(("services/web", "services/db", "pods/db-b")), st.just(0)),
    st.tuples(st.just("idle"), st.just(""), st.integers(1, 90)),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=25))
def test_expiry_invariants(ops: list[tuple[str, Any, int]]) -> None:
    objs = copy.deepcopy(two_zone_cluster())
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=objs["nodes"], services=objs["services"],
                                 endpointslices=objs["endpointslices"], pods=objs["pods"]))
    hints = HintModel(cache)
    hints.refresh(None)
    clock = Clock()
    att = Attributor("nb", MetadataAdapter(cache), hints, series_retention=RETENTION, clock=clock,
                     hold_unresolved_seconds=HOLD)
    exporter = Exporter(version="t")
    start = clock.t
    prev: dict[Any, int] = {}
    last_gain: dict[Any, float] = {}
    expired_any: list[int] = []
    for op, arg, n in ops:
        for _ in range(n if op == "idle" else 1):
            deltas = []
            if op == "traffic":
                make = {"web": web_request, "db": db_request, "ghost": ghost_request, "dbout": db_egress}
                deltas = [make[w](n) for w in sorted(arg)]
            elif op in ("delete", "create"):
                res, name = arg.split("/")
                obj = next(o for o in objs[{"services": "services", "pods": "pods"}[res]]
                           if o["metadata"]["name"] == name)
                cache.apply(res, "DELETED" if op == "delete" else "ADDED", obj)
            at = T0 + clock.t - start
            hints.refresh(cache.take_dirty(), at=at)
            att.attribute(deltas, at)
            att.close_interval(at)
            t = att.totals()
            assert balanced(att)
            now = dict(t.service_bytes) | dict(t.workload_bytes)
            for k, v in now.items():
                if k in prev:
                    assert v >= prev[k], f"{k} went down while present"
                if prev.get(k) != v:
                    last_gain[k] = clock.t
            for k in prev.keys() - now.keys():
                assert clock.t - last_gain[k] >= RETENTION, f"{k} dropped while gaining"
                ns = k.namespace
                if hasattr(k, "service"):
                    assert cache.service(ns, k.service) is None, f"{k} dropped, Service exists"
            prev = now
            exporter.update(build_snapshot(t, locality=hints.localities(), table=None, attached=0,
                                           synced={}, duration=0.0, at=at, interval=STEP))
            text = generate_latest(exporter.registry()).decode()
            got = [(s.name, frozenset(s.labels.items()))
                   for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name in ("zonemeter_service_bytes_total", "zonemeter_workload_bytes_total")]
            assert len(got) == len(set(got)) == len(now)
            expired_any.append(sum(t.series_expired.values()))
            clock.t += STEP
    event(f"series expired: {bool(expired_any and expired_any[-1])}")
