"""Series expiry (``--series-retention``, docs/attribution.md): series of deleted objects go, others stay.

Everything is real except the clock: a ClusterMetadata cache loaded from API-shaped objects
(tests/fixtures/topologies.py two_zone_cluster), the HintModel over it, the Attributor with the
MetadataAdapter as its ObjectView, build_snapshot and the Exporter, scraped with
prometheus_client's text format and parsed back. The monotonic clock the retention is
measured on is a fake the test advances; the drains' wall-clock ``at`` follows it.

Node ``nb`` (zone-b) holds the endpoints web-b (10.244.2.20:8080) and db-b
(10.244.2.30:5432) and the pod client-b (10.244.2.10, Deployment ``client``, whose other
pod client-a runs on node ``na``).
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import (
    EXPIRY_FAMILIES,
    FAMILY_CLIENT_PATH,
    FAMILY_HINT_IGNORED,
    FAMILY_SERVICE,
    FAMILY_SERVICE_ENTRY,
    FAMILY_WORKLOAD,
    SWEEP_FRACTION,
    Attributor,
)
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s import MetadataAdapter
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.loop import build_snapshot
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock
from tests.fixtures.topologies import two_zone_cluster

ip = ipaddress.ip_address
RETENTION = 600.0
STEP = 10.0  # the agent's interval
T0 = 1_764_000_000.0  # wall clock of the first drain
INTERNET = "93.184.216.34"


class Node:
    """The real pipeline for node ``nb`` with a fake clock: feed deltas, tick, scrape."""

    def __init__(self, retention: float = RETENTION) -> None:
        self.objs = two_zone_cluster()
        self.cache = ClusterMetadata()
        self.cache.load_snapshot(Snapshot(nodes=self.objs["nodes"], services=self.objs["services"],
                                          endpointslices=self.objs["endpointslices"],
                                          pods=self.objs["pods"]))
        self.hints = HintModel(self.cache)
        self.hints.refresh(None)
        self.clock = Clock(5000.0)
        self.start = self.clock.t
        self.att = Attributor("nb", MetadataAdapter(self.cache), self.hints,
                              series_retention=retention, clock=self.clock)
        self.exporter = Exporter(version="t")

    @property
    def elapsed(self) -> float:
        return self.clock.t - self.start

    def tick(self, deltas: list[FlowDelta] = ()) -> None:  # type: ignore[assignment]
        """One agent interval: refresh hints for changed objects, attribute, close, export."""
        at = T0 + self.elapsed
        self.hints.refresh(self.cache.take_dirty(), at=at)
        self.att.attribute(list(deltas), at)
        self.att.close_interval(at)
        self.exporter.update(build_snapshot(self.att.totals(), locality=self.hints.localities(), table=None,
                                            attached=0, synced={}, duration=0.0, at=at, interval=STEP))
        self.clock.t += STEP

    def idle_until(self, elapsed: float) -> None:
        while self.elapsed < elapsed:
            self.tick()

    def delete(self, resource: str, name: str) -> None:
        obj = next(o for o in self.objs[resource] if o["metadata"]["name"] == name)
        self.cache.apply(resource, "DELETED", obj)

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """``/metrics`` as ``{(sample name, labels): value}``."""
        text = generate_latest(self.exporter.registry()).decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}


def d(kind: FlowKind, local: str, remote: str, port: int, nbytes: int) -> FlowDelta:
    return FlowDelta(kind, ip(local), ip(remote), port, 6, nbytes, 1)


def web_request(n: int = 600) -> FlowDelta:  # client-a (zone-a) -> web-b: hint-ignored too
    return d(FlowKind.REQUEST, "10.244.2.20", "10.244.1.10", 8080, n)


def db_request(n: int = 100) -> FlowDelta:  # client-b -> db-b, same node
    return d(FlowKind.REQUEST, "10.244.2.30", "10.244.2.10", 5432, n)


def client_egress(n: int = 50) -> FlowDelta:  # client-b -> the internet: workload series
    return d(FlowKind.EGRESS, "10.244.2.10", INTERNET, 443, n)


def samples(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
            **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    want = set(labels.items())
    return {lb: v for (n, lb), v in scrape.items() if n == name and want <= lb}


def expired(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    return {dict(lb)["family"]: v
            for lb, v in samples(scrape, "zonemeter_series_expired_total").items()}


def balanced(att: Attributor) -> bool:
    """Per-node conservation with expiry: every byte seen is in exactly one place."""
    t = att.totals()
    return t.bytes_seen == (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
                            + sum(t.unattributed_bytes.values()) + sum(t.skipped_bytes.values())
                            + sum(t.service_entry_bytes.values())
                            + t.held_bytes + t.expired_bytes[FAMILY_SERVICE]
                            + t.expired_bytes[FAMILY_WORKLOAD] + t.expired_bytes[FAMILY_SERVICE_ENTRY])


#: a series goes between 1x and (1 + 2 * SWEEP_FRACTION)x the retention after its last byte
LATEST = RETENTION * (1 + 2 * SWEEP_FRACTION) + STEP


# ----------------------------------------------------------------------------- Services


def test_deleted_service_stays_within_retention_and_goes_after() -> None:
    n = Node()
    n.tick([web_request(), db_request()])
    last_byte = n.elapsed - STEP
    s = n.scrape()
    assert samples(s, "zonemeter_service_bytes_total", service="web")
    assert samples(s, "zonemeter_service_hint_ignored_bytes_total", service="web")
    assert samples(s, "zonemeter_service_locality_in_effect", service="web")
    n.delete("services", "web")
    n.delete("endpointslices", "web-abcde")
    n.tick()
    # the locality gauges go with the hint model's Service at once; the counters stay
    s = n.scrape()
    assert not samples(s, "zonemeter_service_locality_in_effect", service="web")
    assert not samples(s, "zonemeter_service_locality_info", service="web")
    while n.elapsed < last_byte + RETENTION:
        s = n.scrape()
        assert samples(s, "zonemeter_service_bytes_total", service="web") == {
            frozenset({("namespace", "shop"), ("service", "web"), ("port", "80"),
                       ("client_zone", "zone-a"), ("server_zone", "zone-b"),
                       ("crossing", "cross_zone"), ("direction", "request"),
                       ("client_kind", "pod"), ("lb_type", "none")}): 600.0}, n.elapsed
        assert samples(s, "zonemeter_service_hint_ignored_bytes_total", service="web"), n.elapsed
        assert expired(s)[FAMILY_SERVICE] == 0
        n.tick()
    n.idle_until(last_byte + LATEST)
    s = n.scrape()
    assert samples(s, "zonemeter_service_bytes_total", service="web") == {}
    assert samples(s, "zonemeter_service_hint_ignored_bytes_total", service="web") == {}
    assert expired(s) == {FAMILY_SERVICE: 1.0, FAMILY_HINT_IGNORED: 1.0, FAMILY_WORKLOAD: 0.0, FAMILY_CLIENT_PATH: 0.0,
                            FAMILY_SERVICE_ENTRY: 0.0}
    # the Service that still exists kept its series; its bytes are all there
    assert list(samples(s, "zonemeter_service_bytes_total", service="db").values()) == [100.0]
    t = n.att.totals()
    assert t.expired_bytes[FAMILY_SERVICE] == 600 and t.expired_bytes[FAMILY_HINT_IGNORED] == 600
    assert balanced(n.att)


def test_existing_idle_service_never_expires() -> None:
    n = Node()
    n.tick([db_request(), web_request()])
    n.delete("services", "web")  # proves sweeps ran: web goes, db (idle as long) stays
    n.idle_until(10 * RETENTION)
    s = n.scrape()
    assert list(samples(s, "zonemeter_service_bytes_total", service="db").values()) == [100.0]
    assert samples(s, "zonemeter_service_bytes_total", service="web") == {}
    assert expired(s)[FAMILY_SERVICE] == 1


def test_series_gaining_bytes_never_expires_and_goes_once_idle() -> None:
    n = Node()
    n.tick([web_request()])
    # the Service is deleted but its EndpointSlice lingers (garbage collection is not
    # instant): bytes still reach web (port unknown now: "0"), the port-80 series is idle
    n.delete("services", "web")
    first_gain = n.elapsed
    while n.elapsed < first_gain + 3 * RETENTION:
        n.tick([web_request(10)])
    last_byte = n.elapsed - STEP
    s = n.scrape()
    live = samples(s, "zonemeter_service_bytes_total", service="web")
    assert [dict(lb)["port"] for lb in live] == ["0"]  # still gaining: kept, and growing
    assert list(live.values()) == [10.0 * (3 * RETENTION / STEP)]
    assert expired(s)[FAMILY_SERVICE] == 1  # the idle port-80 series went meanwhile
    n.idle_until(last_byte + RETENTION - STEP)
    assert samples(n.scrape(), "zonemeter_service_bytes_total", service="web")
    n.idle_until(last_byte + LATEST)
    assert samples(n.scrape(), "zonemeter_service_bytes_total", service="web") == {}
    assert expired(n.scrape())[FAMILY_SERVICE] == 2
    assert balanced(n.att)


def test_bytes_after_expiry_start_a_new_series_from_zero() -> None:
    n = Node()
    n.tick([web_request(), db_request()])
    n.delete("services", "db")  # the slice stays: db's endpoint still maps to db (port 0)
    n.tick([db_request(7)])  # port "0" series
    n.idle_until(LATEST + STEP)
    assert samples(n.scrape(), "zonemeter_service_bytes_total", service="db") == {}
    n.tick([db_request(5)])
    assert list(samples(n.scrape(), "zonemeter_service_bytes_total", service="db").values()) == [5.0]
    assert n.att.totals().expired_bytes[FAMILY_SERVICE] == 107
    assert balanced(n.att)


def test_retention_zero_never_expires() -> None:
    n = Node(retention=0)
    n.tick([web_request(), client_egress()])
    n.delete("services", "web")
    n.delete("endpointslices", "web-abcde")
    n.delete("pods", "client-a")
    n.delete("pods", "client-b")
    n.idle_until(20 * RETENTION)
    s = n.scrape()
    assert samples(s, "zonemeter_service_bytes_total", service="web")
    assert samples(s, "zonemeter_service_hint_ignored_bytes_total", service="web")
    assert samples(s, "zonemeter_workload_bytes_total", workload="client")
    assert expired(s) == {f: 0.0 for f in EXPIRY_FAMILIES}


def test_attributor_rejects_a_negative_retention_and_a_view_without_objects() -> None:
    n = Node()
    with pytest.raises(ValueError, match="series_retention"):
        Attributor("nb", MetadataAdapter(n.cache), n.hints, series_retention=-1)
    with pytest.raises(ValueError, match="series_retention"):
        Attributor("nb", MetadataAdapter(n.cache), n.hints, series_retention=math.nan)

    class NoObjects:  # a MetadataView that cannot say what exists
        def __init__(self, inner: MetadataAdapter) -> None:
            self.resolve, self.node = inner.resolve, inner.node
            self.endpoint_services, self.service_address = inner.endpoint_services, inner.service_address

    with pytest.raises(ValueError, match="ObjectView"):
        Attributor("nb", NoObjects(MetadataAdapter(n.cache)), n.hints, series_retention=60)
    Attributor("nb", NoObjects(MetadataAdapter(n.cache)), n.hints, series_retention=0)


def test_nothing_expires_while_metadata_is_not_synced() -> None:
    n = Node()
    n.tick([web_request(), client_egress()])
    n.delete("services", "web")
    n.delete("pods", "client-a")
    n.delete("pods", "client-b")
    n.cache.set_synced("services", False)  # a relist after an API outage
    n.cache.set_synced("pods", False)
    n.idle_until(3 * RETENTION)
    assert expired(n.scrape()) == {f: 0.0 for f in EXPIRY_FAMILIES}
    n.cache.set_synced("services", True)
    n.cache.set_synced("pods", True)
    n.idle_until(3 * RETENTION + LATEST)
    assert expired(n.scrape()) == {FAMILY_SERVICE: 1.0, FAMILY_HINT_IGNORED: 1.0, FAMILY_WORKLOAD: 1.0,
                                   FAMILY_CLIENT_PATH: 0.0,
                            FAMILY_SERVICE_ENTRY: 0.0}


def test_a_failing_object_view_keeps_every_series(caplog: pytest.LogCaptureFixture) -> None:
    n = Node()

    class Broken(MetadataAdapter):
        def live_services(self, services: Any) -> Any:
            raise RuntimeError("api gone")

        def live_workloads(self, workloads: Any) -> Any:
            raise RuntimeError("api gone")

    n.att = Attributor("nb", Broken(n.cache), n.hints, series_retention=RETENTION, clock=n.clock)
    n.tick([web_request(), client_egress()])
    n.delete("services", "web")
    n.delete("pods", "client-a")
    n.delete("pods", "client-b")
    n.idle_until(5 * RETENTION)
    s = n.scrape()
    assert samples(s, "zonemeter_service_bytes_total", service="web")
    assert samples(s, "zonemeter_workload_bytes_total", workload="client")
    assert expired(s) == {f: 0.0 for f in EXPIRY_FAMILIES}
    warned = [r.getMessage() for r in caplog.records if "series expiry" in r.getMessage()]
    assert len(warned) == 1 and "RuntimeError: api gone" in warned[0]  # once per error type
    assert n.att.totals().unattributed_bytes.get("attribution_error", 0) == 0


# ----------------------------------------------------------------------------- workloads


def test_workload_expires_only_once_all_its_pods_are_gone() -> None:
    n = Node()
    n.tick([client_egress(), db_request()])
    last_byte = n.elapsed - STEP
    key = dict(workload="client", workload_kind="Deployment", direction="egress")
    # this node's pod goes; the Deployment's pod on node na still exists: the series stays
    n.delete("pods", "client-b")
    n.idle_until(last_byte + 5 * RETENTION)
    assert list(samples(n.scrape(), "zonemeter_workload_bytes_total", **key).values()) == [50.0]
    assert expired(n.scrape())[FAMILY_WORKLOAD] == 0
    # its last pod goes: the series has been idle for long, so it goes at the next sweep
    n.delete("pods", "client-a")
    n.idle_until(last_byte + 5 * RETENTION + RETENTION * SWEEP_FRACTION + STEP)
    s = n.scrape()
    assert samples(s, "zonemeter_workload_bytes_total", **key) == {}
    assert expired(s) == {FAMILY_SERVICE: 0.0, FAMILY_HINT_IGNORED: 0.0, FAMILY_WORKLOAD: 1.0, FAMILY_CLIENT_PATH: 0.0,
                            FAMILY_SERVICE_ENTRY: 0.0}
    assert samples(s, "zonemeter_service_bytes_total", service="db")  # db-b's pod is still there
    assert balanced(n.att)


def test_ownerless_pod_churn_keeps_live_series_bounded() -> None:
    """1,000 owner-less pods replaced one by one (each its own workload, kind Pod), one
    minute apart, each sending bytes while it lives: with the default retention the live
    workload series stay bounded; without expiry they grow with every pod."""

    def churn(retention: float) -> tuple[Node, list[int], int]:
        n = Node(retention=retention)
        fixed = len(n.att.totals().workload_bytes)
        counts: list[int] = []
        for i in range(1000):
            name, addr = f"batch-{i}", str(ip("10.250.0.0") + i)
            obj = k8s.pod(name, addr, "nb", app="batch")  # no template hash: no ownerReferences
            n.cache.apply("pods", "ADDED", obj)
            for _ in range(6):  # lives one minute, sends every interval
                n.tick([d(FlowKind.EGRESS, addr, INTERNET, 443, 100)])
            n.cache.apply("pods", "DELETED", obj)
            counts.append(len(n.att.totals().workload_bytes) - fixed)
        return n, counts, fixed

    n, counts, fixed = churn(RETENTION)
    # a pod's series goes 1x-1.2x the retention after its last byte, a minute per pod
    bound = math.ceil(RETENTION * (1 + 2 * SWEEP_FRACTION) / 60) + 1
    assert max(counts) <= bound
    assert min(counts[100:]) >= RETENTION / 60 - 1  # nothing went before its retention
    s = n.scrape()
    live = samples(s, "zonemeter_workload_bytes_total", workload_kind="Pod")
    assert len(live) == counts[-1] <= bound
    assert expired(s)[FAMILY_WORKLOAD] == 1000 - counts[-1]
    assert n.att.totals().expired_bytes[FAMILY_WORKLOAD] == 600 * (1000 - counts[-1])
    assert balanced(n.att)
    # the same churn without expiry: one more series per pod, forever
    _, grown, _ = churn(0)
    assert grown[-1] == 1000


def test_pods_missing_from_the_cache_are_never_expired() -> None:
    # bytes of a local address no pod has (yet): workload "unknown", a catch-all series
    n = Node()
    n.tick([d(FlowKind.EGRESS, "10.244.2.99", INTERNET, 443, 40)])
    assert list(samples(n.scrape(), "zonemeter_workload_bytes_total", workload="unknown").values()) == [40.0]
    n.idle_until(10 * RETENTION)
    assert list(samples(n.scrape(), "zonemeter_workload_bytes_total", workload="unknown").values()) == [40.0]
    assert expired(n.scrape())[FAMILY_WORKLOAD] == 0


# ----------------------------------------------------------------------------- the agent


def test_agent_loop_passes_retention_and_clock_and_exports_the_counter() -> None:
    from types import SimpleNamespace

    from agent.loop import AgentLoop

    class Datapath:
        def __init__(self) -> None:
            self.pending: list[FlowDelta] = []

        def set_local_endpoints(self, eps: Any) -> None:
            pass

        def set_service_ports(self, ports: Any) -> None:
            pass

        def drain(self) -> list[FlowDelta]:
            out, self.pending = self.pending, []
            return out

        def stats(self) -> Any:
            return SimpleNamespace(attached=(), table=None, endpoints=0)

    n = Node()  # for its cache, hint model and clock
    dp, exp = Datapath(), Exporter()
    loop = AgentLoop("nb", dp, n.cache, n.hints, exp, interval=STEP, series_retention=RETENTION,
                     clock=lambda: T0 + n.elapsed, monotonic=n.clock)
    dp.pending = [web_request(), client_egress()]
    loop.tick()
    n.delete("services", "web")
    n.delete("endpointslices", "web-abcde")
    for _ in range(int(LATEST / STEP) + 1):
        n.clock.t += STEP
        loop.tick()
    text = generate_latest(exp.registry()).decode()
    assert 'zonemeter_series_expired_total{family="zonemeter_service_bytes_total"} 1.0' in text
    assert 'service="web"' not in text
    assert 'workload="client"' in text  # its pods still exist


@pytest.mark.parametrize("value, message", [
    ("-1", "--series-retention: must be >= 0 (0: never expire), got -1"),
    ("nan", "--series-retention: must be >= 0"),
])
def test_cli_rejects_a_bad_retention_in_one_line(value: str, message: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from agent import cli

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(["agent", "--node-name", "nb", "--series-retention", value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_cli_default_retention_is_ten_minutes() -> None:
    from agent import cli

    args = cli.build_parser().parse_args(["agent", "--node-name", "nb"])
    assert args.series_retention == 600.0
    args = cli.build_parser().parse_args(["agent", "--node-name", "nb", "--series-retention", "0"])
    assert args.series_retention == 0.0
