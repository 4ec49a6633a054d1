"""agent.k8s.watch against a Kubernetes API served over real HTTP by kmock.

The production code path runs unchanged: :func:`build_api_client` with a host, the official
client's list functions, :class:`MetadataWatcher` threads. kmock's emulator keeps objects
and streams watch events but has no resourceVersion semantics, so 410 Gone, dropped
connections, server errors and unknown event types are injected with kmock reactions.
Tests are async (kmock runs on the event loop); the watcher threads use blocking HTTP.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock as kmock_lib
import pytest
import pytest_asyncio

from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.client import build_api_client
from agent.k8s.watch import MetadataWatcher, WatchSettings
from agent.records import PeerKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock

ip = ipaddress.ip_address
PODS = kmock_lib.resource("v1/pods")
NODES = kmock_lib.resource("v1/nodes")
SERVICES = kmock_lib.resource("v1/services")
SLICES = kmock_lib.resource("discovery.k8s.io/v1/endpointslices")

pytestmark = pytest.mark.asyncio

FAST = WatchSettings(timeout_seconds=1, read_margin_seconds=0.5, connect_timeout_seconds=1,
                     backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                     unsynced_after_seconds=0.3)


async def until(cond: Callable[[], bool], timeout: float = 8.0) -> None:
    """Poll ``cond`` without blocking the event loop kmock serves on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)


def seed(km: Any) -> None:
    km.resources["v1/pods"] = {}
    km.resources["v1/nodes"] = {}
    km.resources["v1/services"] = {}
    km.resources["discovery.k8s.io/v1/endpointslices"] = {}
    km.objects[NODES, None, "n1"] = k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"],
                                             region="region-1", noise=True)
    km.objects[NODES, None, "n2"] = k8s.node("n2", "zone-b", internal="192.168.0.2", pod_cidrs=["10.0.2.0/24"],
                                             region="region-1", noise=True)
    km.objects[PODS, "shop", "web-1"] = k8s.pod("web-1", "10.0.1.5", "n1", owner=("ReplicaSet", "web-5f7c9"),
                                                template_hash="5f7c9", noise=True)
    km.objects[PODS, "shop", "stale"] = k8s.pod("stale", "10.0.2.9", "n2", noise=True)
    km.objects[SERVICES, "shop", "web"] = k8s.service("web", "shop", cluster_ip="10.96.0.10",
                                                      ports=[{"name": "http", "port": 80,
                                                              "targetPort": 8080}], selector={}, noise=True)
    km.objects[SLICES, "shop", "web-abc"] = k8s.endpointslice(
        "web-abc", "web", [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x", target_namespace="y")],
        ports=[{"name": "http", "port": 8080, "protocol": "TCP"}], noise=True)


class Rig:
    def __init__(self, km: Any, clock: Clock, settings: WatchSettings = FAST) -> None:
        self.km = km
        self.clock = clock
        self.cache = ClusterMetadata(MetadataSettings(grace_seconds=60), clock=clock)
        self.api = build_api_client(host=str(km.url).rstrip("/"))
        self.watcher = MetadataWatcher(self.api, self.cache, settings)

    def stats(self, resource: str) -> Any:
        return self.watcher.watchers[resource].stats

    def synced(self, resource: str = "pods") -> bool:
        return self.cache.synced()[resource]

    def requests(self, action: Any, resource: Any) -> list[Any]:
        return list(self.km[action, resource])


@pytest_asyncio.fixture()
async def rig(kmock: Any) -> AsyncIterator[Rig]:
    seed(kmock)
    r = Rig(kmock, Clock())
    yield r
    await asyncio.to_thread(r.watcher.stop, 5.0)
    assert not any(t.is_alive() for t in r.watcher._threads), "watch threads did not stop"


async def start(r: Rig) -> None:
    r.watcher.start()
    await until(lambda: all(r.cache.synced().values()))


async def test_initial_list_then_watch_from_its_resource_version(rig: Rig) -> None:
    await start(rig)
    peer = rig.cache.resolve(ip("10.0.1.5"))
    assert (peer.kind, peer.workload, peer.workload_kind, peer.zone) == (
        PeerKind.POD, "web", "Deployment", "zone-a")
    assert rig.cache.endpoint_services(ip("10.0.1.5"), 8080, 6)[0].port == 80
    assert rig.cache.service_address(ip("10.96.0.10"), 80, 6) is not None
    assert rig.cache.local_endpoints("n1") == frozenset({(ip("10.0.1.5"), 8080, 6)})
    for res in (PODS, NODES, SERVICES, SLICES):
        await until(lambda res=res: len(rig.requests(kmock_lib.action.WATCH, res)) >= 1)
        assert len(rig.requests(kmock_lib.action.LIST, res)) == 1
        first_watch = rig.requests(kmock_lib.action.WATCH, res)[0]
        # kmock answers lists with resourceVersion "..." and the watch must start from it
        assert first_watch.params["resourceVersion"] == "..."
        assert first_watch.params["allowWatchBookmarks"] == "true"
        assert first_watch.url.path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/services",
                                    "/apis/discovery.k8s.io/v1/endpointslices")


async def test_added_modified_deleted_events_update_the_cache(rig: Rig) -> None:
    await start(rig)
    km = rig.km
    await km.post("/api/v1/namespaces/shop/pods",
                  json=k8s.pod("api-1", "10.0.2.20", "n2", owner=("StatefulSet", "api"), noise=True))
    await until(lambda: rig.cache.resolve(ip("10.0.2.20")).kind is PeerKind.POD)
    assert rig.cache.resolve(ip("10.0.2.20")).workload_kind == "StatefulSet"

    await km.patch("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-abc",
                   json={"endpoints": [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x", target_namespace="y"),
                                       k8s.endpoint("10.0.2.20", "zone-b", "n2", target="x", target_namespace="y")]})
    await until(lambda: rig.cache.endpoint_services(ip("10.0.2.20"), 8080, 6) != ())
    assert rig.cache.local_endpoints("n2") == frozenset({(ip("10.0.2.20"), 8080, 6)})

    await km.patch("/api/v1/nodes/n2", json={"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-c"}}})
    await until(lambda: rig.cache.resolve(ip("10.0.2.20")).zone == "zone-c")

    rig.clock.t = 1010
    await km.delete("/api/v1/namespaces/shop/pods/api-1")
    await until(lambda: rig.cache.counts()["pods"] == 2)
    assert rig.cache.resolve(ip("10.0.2.20")).name == "api-1"  # within the grace
    rig.clock.t = 1071
    assert rig.cache.resolve(ip("10.0.2.20")).kind is PeerKind.UNKNOWN  # grace over
    assert len(rig.requests(kmock_lib.action.LIST, PODS)) == 1  # events, never a relist


async def test_deleted_pod_ip_reused_within_grace_resolves_by_time(rig: Rig) -> None:
    await start(rig)
    km = rig.km
    rig.clock.t = 2000
    await km.post("/api/v1/namespaces/shop/pods", json=k8s.pod("old", "10.0.1.50", "n1", noise=True))
    await until(lambda: rig.cache.resolve(ip("10.0.1.50")).name == "old")
    rig.clock.t = 2010
    await km.delete("/api/v1/namespaces/shop/pods/old")
    await until(lambda: rig.cache.counts()["deleted_ips"] == 1)
    rig.clock.t = 2012
    await km.post("/api/v1/namespaces/other/pods",
                  json=k8s.pod("new", "10.0.1.50", "n1", namespace="other", noise=True))
    await until(lambda: rig.cache.resolve(ip("10.0.1.50")).name == "new")
    assert rig.cache.resolve(ip("10.0.1.50"), at=2005).namespace == "shop"
    assert rig.cache.resolve(ip("10.0.1.50"), at=2011).name == "old"
    assert rig.cache.resolve(ip("10.0.1.50"), at=2013).namespace == "other"


async def test_410_gone_event_lists_again_and_repairs_missed_deletes(rig: Rig) -> None:
    km = rig.km
    fired: list[int] = []

    def gone_once(request: Any) -> Any:
        if fired:
            return NotImplemented  # from now on the emulator serves watches
        fired.append(1)
        # while the watch was away, "stale" was deleted: no DELETED event will ever come
        km.objects[PODS, "shop", "stale"].delete()
        return ({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "code": 410, "reason": "Expired",
                                             "message": "too old resource version: 1 (99)"}},)

    km[kmock_lib.action.WATCH, PODS] << gone_once
    await start(rig)
    await until(lambda: rig.stats("pods").lists == 2)
    await until(lambda: rig.cache.counts()["pods"] == 1)
    assert rig.stats("pods").relists == 1
    assert rig.synced("pods")
    assert len(rig.requests(kmock_lib.action.LIST, PODS)) == 2
    assert len(rig.requests(kmock_lib.action.LIST, NODES)) == 1  # only the expired resource


async def test_410_status_on_watch_request_lists_again(rig: Rig) -> None:
    km = rig.km
    fired: list[int] = []

    def gone_status_once(request: Any) -> Any:
        if fired:
            return NotImplemented
        fired.append(1)
        return kmock_lib.Response(status=410, payload={"kind": "Status", "code": 410, "reason": "Gone"})

    km[kmock_lib.action.WATCH, NODES] << gone_status_once
    await start(rig)
    await until(lambda: rig.stats("nodes").lists == 2)
    assert rig.stats("nodes").errors == 0  # a 410 is not an error: no backoff


async def test_dropped_watch_resumes_from_last_version_without_listing(rig: Rig) -> None:
    km = rig.km
    fired: list[int] = []
    added = k8s.pod("late", "10.0.1.77", "n1", noise=True)
    added["metadata"]["resourceVersion"] = "42"

    def one_event_then_eof(request: Any) -> Any:
        if fired:
            return NotImplemented
        fired.append(1)
        return ({"type": "ADDED", "object": added},)  # the server closes after this line

    km[kmock_lib.action.WATCH, PODS] << one_event_then_eof
    await start(rig)
    await until(lambda: len(rig.requests(kmock_lib.action.WATCH, PODS)) >= 2)
    assert rig.cache.resolve(ip("10.0.1.77")).name == "late"
    second = rig.requests(kmock_lib.action.WATCH, PODS)[1]
    assert second.params["resourceVersion"] == "42"
    assert len(rig.requests(kmock_lib.action.LIST, PODS)) == 1
    assert rig.stats("pods").errors == 0


async def test_unknown_event_types_are_skipped(rig: Rig) -> None:
    km = rig.km
    fired: list[int] = []

    def weird_then_added(request: Any) -> Any:
        if fired:
            return NotImplemented
        fired.append(1)
        return ({"type": "SURPRISE", "object": k8s.pod("weird", "10.0.1.66", "n1", noise=True)},
                "not json at all",
                {"type": "ADDED", "object": k8s.pod("fine", "10.0.1.67", "n1", noise=True)})

    km[kmock_lib.action.WATCH, PODS] << weird_then_added
    await start(rig)
    await until(lambda: rig.cache.resolve(ip("10.0.1.67")).kind is PeerKind.POD)
    assert rig.cache.resolve(ip("10.0.1.66")).kind is PeerKind.UNKNOWN
    assert rig.stats("pods").unknown_events == 1
    assert rig.stats("pods").unknown_types == {"SURPRISE"}


async def test_errors_back_off_mark_unsynced_then_recover_by_listing(rig: Rig) -> None:
    km = rig.km
    failing = {"on": False}
    km[PODS][lambda request: failing["on"]] << 500 << {"kind": "Status", "code": 500, "message": "etcd down"}
    await start(rig)
    failing["on"] = True
    # the open watch times out (1 s + 0.5 s) and every retry gets 500 until the threshold
    await until(lambda: not rig.synced("pods"))
    errors_while_failing = rig.stats("pods").errors
    assert errors_while_failing >= 2
    assert rig.cache.synced()["nodes"]  # other resources unaffected
    await asyncio.sleep(0.5)
    # bounded backoff: at most 0.2 s between attempts, so a few more attempts happened
    assert rig.stats("pods").errors > errors_while_failing
    assert "500" in rig.stats("pods").last_error
    failing["on"] = False
    await until(lambda: rig.synced("pods"))
    assert rig.stats("pods").lists == 2  # listed again after the outage, not just re-watched


async def test_api_server_down_and_back(kmock: Any) -> None:
    """The API server process goes away (connection refused) and comes back on its port."""
    seed(kmock)
    server = kmock_lib.Server(kmock)
    await server.__aenter__()
    port = server.port
    api = build_api_client(host=f"http://127.0.0.1:{port}")
    cache = ClusterMetadata()
    watcher = MetadataWatcher(api, cache, FAST, resources=("pods",))
    watcher.start()
    try:
        await until(lambda: cache.synced()["pods"])
        await server.__aexit__(None, None, None)
        await until(lambda: not cache.synced()["pods"])
        assert cache.resolve(ip("10.0.1.5")).kind is PeerKind.POD  # the cache keeps serving
        server = kmock_lib.Server(kmock, port=port)
        await server.__aenter__()
        await until(lambda: cache.synced()["pods"])
        assert watcher.watchers["pods"].stats.lists == 2
    finally:
        await asyncio.to_thread(watcher.stop, 5.0)
        await server.__aexit__(None, None, None)
    assert not watcher.alive()


async def test_stop_interrupts_an_open_watch_quickly(kmock: Any) -> None:
    seed(kmock)
    slow = WatchSettings(timeout_seconds=300, read_margin_seconds=30)
    api = build_api_client(host=str(kmock.url).rstrip("/"))
    watcher = MetadataWatcher(api, ClusterMetadata(), slow)
    watcher.start()
    await until(lambda: all(watcher.cache.synced().values()))
    await until(lambda: all(w.stats.watches == 1 for w in watcher.watchers.values()))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.to_thread(watcher.stop, 5.0)
    assert not watcher.alive()
    assert loop.time() - t0 < 3.0


async def test_paged_list_follows_continue_and_watches_from_the_first_page_version(rig: Rig) -> None:
    km = rig.km
    page1 = {"kind": "PodList", "apiVersion": "v1",
             "metadata": {"resourceVersion": "77", "continue": "tok-1"},
             "items": [k8s.pod("p1", "10.0.1.101", "n1", noise=True)]}
    page2 = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "77"},
             "items": [k8s.pod("p2", "10.0.1.102", "n1", noise=True)]}
    km[kmock_lib.action.LIST, PODS][lambda request: "continue" not in request.params] << page1
    km[kmock_lib.action.LIST, PODS][lambda request: request.params.get("continue") == "tok-1"] << page2
    await start(rig)
    lists = rig.requests(kmock_lib.action.LIST, PODS)
    assert [r.params.get("limit") for r in lists] == ["500", "500"]
    assert rig.cache.resolve(ip("10.0.1.101")).name == "p1"
    assert rig.cache.resolve(ip("10.0.1.102")).name == "p2"
    await until(lambda: len(rig.requests(kmock_lib.action.WATCH, PODS)) >= 1)
    assert rig.requests(kmock_lib.action.WATCH, PODS)[0].params["resourceVersion"] == "77"


@pytest.mark.parametrize("event, errors", [
    ({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                     "metadata": {"resourceVersion": "55"}}}, 0),
    ({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "internal"}}, 1),
])
async def test_bookmark_advances_version_and_error_event_backs_off(rig: Rig, event: dict[str, Any],
                                                                    errors: int) -> None:
    km = rig.km
    fired: list[int] = []
    added = k8s.pod("v", "10.0.1.88", "n1", noise=True)
    added["metadata"]["resourceVersion"] = "50"

    def stream_once(request: Any) -> Any:
        if fired:
            return NotImplemented
        fired.append(1)
        return ({"type": "ADDED", "object": added}, event)

    km[kmock_lib.action.WATCH, PODS] << stream_once
    await start(rig)
    await until(lambda: len(rig.requests(kmock_lib.action.WATCH, PODS)) >= 2)
    expected_rv = "55" if event["type"] == "BOOKMARK" else "50"
    assert rig.requests(kmock_lib.action.WATCH, PODS)[1].params["resourceVersion"] == expected_rv
    assert rig.stats("pods").errors == errors
    assert len(rig.requests(kmock_lib.action.LIST, PODS)) == 1


async def test_open_metadata_live_source(kmock: Any) -> None:
    from agent.k8s.source import open_metadata

    seed(kmock)
    src = open_metadata(host=str(kmock.url).rstrip("/"), watch_settings=FAST)
    try:
        assert src.origin.startswith("host:http://")
        await until(lambda: all(src.cache.synced().values()))
        assert src.cache.resolve(ip("10.0.1.5")).workload == "web"
    finally:
        await asyncio.to_thread(src.stop)
    assert src.watcher is not None and not src.watcher.alive()


def _server_side_connections(port: int) -> int:
    """ESTABLISHED TCP sockets whose local port is ``port`` (this netns, IPv4 and IPv6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":
                count += 1
    return count


async def test_quiet_watches_that_time_out_are_closed_not_pooled(kmock: Any) -> None:
    """kmock never ends a watch, so every 1.5 s the client gives up on a quiet one and
    watches again: the abandoned connection must be closed, or the server keeps a handler
    streaming into it and the pool hands half-read streams to later requests."""
    seed(kmock)
    api = build_api_client(host=str(kmock.url).rstrip("/"))
    cache = ClusterMetadata()
    watcher = MetadataWatcher(api, cache, FAST, resources=("pods",))
    watcher.start()
    try:
        await until(lambda: watcher.watchers["pods"].stats.watches >= 3)
        await until(lambda: _server_side_connections(kmock.servers[0].port) == 1)
        await kmock.post("/api/v1/namespaces/shop/pods", json=k8s.pod("after", "10.0.1.99", "n1", noise=True))
        await until(lambda: cache.resolve(ip("10.0.1.99")).name == "after")
        assert watcher.watchers["pods"].stats.errors == 0
        assert watcher.watchers["pods"].stats.lists == 1
    finally:
        await asyncio.to_thread(watcher.stop, 5.0)


async def test_pod_scope_node_lists_and_watches_only_its_nodes_pods(kmock: Any) -> None:
    """``--pod-scope node``: pods are listed and watched with ``fieldSelector=
    spec.nodeName=n1`` (the other kinds without), and the cache drops another node's pod
    even when a server (kmock, which does not filter) sends it."""
    seed(kmock)
    cache = ClusterMetadata(MetadataSettings(pod_node="n1"), clock=Clock())
    watcher = MetadataWatcher(build_api_client(host=str(kmock.url).rstrip("/")), cache, FAST, pod_node="n1")
    watcher.start()
    try:
        await until(lambda: all(cache.synced().values()))
        await until(lambda: len(list(kmock[kmock_lib.action.WATCH, PODS])) >= 1)
        for action in (kmock_lib.action.LIST, kmock_lib.action.WATCH):
            assert [r.params.get("fieldSelector") for r in kmock[action, PODS]][:1] == ["spec.nodeName=n1"]
            for res in (NODES, SERVICES, SLICES):
                assert all("fieldSelector" not in r.params for r in kmock[action, res])
        assert cache.counts()["pods"] == 1   # web-1 on n1; "stale" on n2 dropped
        # the other node's pod address resolves through n2's podCIDR: a pod there, nameless
        peer = cache.resolve(ip("10.0.2.9"))
        assert (peer.kind, peer.node, peer.zone, peer.name) == (PeerKind.POD, "n2", "zone-b", None)
    finally:
        await asyncio.to_thread(watcher.stop, 5.0)


async def test_a_throttled_page_is_asked_again_after_retry_after_not_the_whole_list(rig: Rig) -> None:
    """API Priority and Fairness answers 429 with Retry-After when the agents' priority level
    is full (50 agents listing 20,000 pods at once: BENCHMARKS.md, API fan-out). The same page
    is asked again after the wait, keeping its continue token: restarting the list at page 1
    after every 429 (as any error did) kept every agent from ever finishing its list."""
    km = rig.km
    page1 = {"kind": "PodList", "apiVersion": "v1",
             "metadata": {"resourceVersion": "77", "continue": "tok-1"},
             "items": [k8s.pod("p1", "10.0.1.101", "n1", noise=True)]}
    page2 = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "77"},
             "items": [k8s.pod("p2", "10.0.1.102", "n1", noise=True)]}
    throttled = {"left": 2}

    def second(request: Any) -> Any:
        if throttled["left"]:
            throttled["left"] -= 1
            return kmock_lib.Response(status=429, headers={"Retry-After": "1"},
                                      payload={"kind": "Status", "code": 429, "reason": "TooManyRequests"})
        return kmock_lib.Response(status=200, payload=page2)

    km[kmock_lib.action.LIST, PODS][lambda request: "continue" not in request.params] << page1
    km[kmock_lib.action.LIST, PODS][lambda request: request.params.get("continue") == "tok-1"] << second
    await start(rig)
    lists = rig.requests(kmock_lib.action.LIST, PODS)
    assert [r.params.get("continue") for r in lists] == [None, "tok-1", "tok-1", "tok-1"]
    assert rig.stats("pods").throttled == 2 and rig.stats("pods").errors == 0
    assert rig.cache.resolve(ip("10.0.1.102")).name == "p2"


async def test_retry_after_reads_the_header_within_bounds() -> None:
    from kubernetes.client.exceptions import ApiException

    from agent.k8s.watch import MAX_RETRY_AFTER_SECONDS, retry_after

    def err(status: int, value: str | None) -> ApiException:
        e = ApiException(status=status, reason="x")
        e.headers = {"Retry-After": value} if value is not None else {}
        return e

    assert retry_after(err(429, "32")) == 32.0
    assert retry_after(err(429, None)) == 1.0
    assert retry_after(err(429, "soon")) == 1.0
    assert retry_after(err(429, "0")) == 1.0
    assert retry_after(err(429, "9999")) == MAX_RETRY_AFTER_SECONDS
    assert retry_after(err(503, "5")) is None
