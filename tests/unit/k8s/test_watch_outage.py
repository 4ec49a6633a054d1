"""Attacks on the list+watch loop (API outage and odd objects on the watch).

Same rig as ``tests/unit/k8s/test_watch.py``: the official client over real HTTP against kmock,
failures injected with kmock reactions.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import kmock as kmock_lib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from agent.k8s.cache import ClusterMetadata
from agent.k8s.client import build_api_client
from agent.k8s.watch import ResourceWatcher, WatchSettings
from agent.records import PeerKind
from tests.fixtures import k8s
from tests.unit.k8s.test_watch import PODS, Clock, Rig, ip, seed, start, until


@pytest.fixture()
def rig(kmock: Any) -> Any:
    seed(kmock)
    return Rig(kmock, Clock())


async def _stop(r: Rig) -> None:
    await asyncio.to_thread(r.watcher.stop, 5.0)
    assert not any(t.is_alive() for t in r.watcher._threads)


@pytest.mark.asyncio
async def test_watches_that_only_stream_an_error_event_go_unsynced_and_relist(rig: Rig) -> None:
    """An API server that accepts every watch (HTTP 200) and then sends only an ERROR
    event (etcd unavailable; "too large resource version" after an etcd restore) is an
    outage: the resource must go unsynced and be listed again, with growing backoff. It
    used to count as answered at every attempt: synced stayed 1 forever, no relist, a
    retry every ``backoff_initial_seconds``."""
    km = rig.km
    failing = {"on": False}

    def error_stream(request: Any) -> Any:
        return ({"type": "ERROR", "object": {"kind": "Status", "code": 500,
                                              "message": "etcdserver: request timed out"}},)

    km[kmock_lib.action.WATCH, PODS][lambda request: failing["on"]] << error_stream
    try:
        await start(rig)
        failing["on"] = True
        # end the open watch so the next one meets the failure
        rig.watcher.watchers["pods"].interrupt()
        await until(lambda: not rig.synced("pods"), timeout=6.0)
        assert rig.stats("pods").errors >= 2
        assert "etcdserver" in rig.stats("pods").last_error
        lists = rig.stats("pods").lists
        failing["on"] = False
        await until(lambda: rig.synced("pods"), timeout=6.0)
        assert rig.stats("pods").lists > lists  # recovered by listing, not just re-watching
    finally:
        await _stop(rig)


@pytest.mark.asyncio
async def test_error_events_back_off_instead_of_retrying_at_the_initial_delay(kmock: Any) -> None:
    """With every watch answered by an ERROR event, retries must slow down to the cap."""
    seed(kmock)
    fired: list[float] = []

    def error_stream(request: Any) -> Any:
        fired.append(asyncio.get_running_loop().time())
        return ({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "down"}},)

    kmock[kmock_lib.action.WATCH, PODS] << error_stream
    settings = WatchSettings(timeout_seconds=1, read_margin_seconds=0.5, connect_timeout_seconds=1,
                             backoff_initial_seconds=0.05, backoff_max_seconds=0.4,
                             unsynced_after_seconds=60)
    api = build_api_client(host=str(kmock.url).rstrip("/"))
    w = ResourceWatcher(client.CoreV1Api(api).list_pod_for_all_namespaces, "pods",
                        ClusterMetadata(), settings, threading.Event())
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    try:
        await until(lambda: len(fired) >= 7, timeout=10.0)
        gaps = [b - a for a, b in zip(fired, fired[1:], strict=False)]
        # 0.05, 0.1, 0.2, 0.4, 0.4, ...: the later gaps are at the cap, not at 0.05 s
        assert min(gaps[-2:]) >= 0.3, gaps
    finally:
        w.stop_event.set()
        w.interrupt()
        await asyncio.to_thread(th.join, 5.0)
    assert not th.is_alive()


@pytest.mark.asyncio
async def test_an_event_whose_metadata_is_not_an_object_is_skipped_not_fatal(rig: Rig) -> None:
    """A watch event carrying an object with ``metadata`` of the wrong type is counted as
    a bad object and skipped; the events after it on the same stream still apply. It used
    to end the watch with an AttributeError, resumed from before that event."""
    km = rig.km
    fired: list[int] = []
    good = k8s.pod("fine", "10.0.1.67", "n1", noise=True)
    good["metadata"]["resourceVersion"] = "60"

    def odd_then_good(request: Any) -> Any:
        if fired:
            return NotImplemented
        fired.append(1)
        return ({"type": "ADDED", "object": {"kind": "Pod", "metadata": ["not", "a", "map"]}},
                {"type": "MODIFIED", "object": {"kind": "Pod", "metadata": {"name": "x",
                                                "namespace": "shop", "resourceVersion": {"a": 1}}}},
                {"type": "ADDED", "object": good})

    km[kmock_lib.action.WATCH, PODS] << odd_then_good
    try:
        await start(rig)
        await until(lambda: rig.cache.resolve(ip("10.0.1.67")).kind is PeerKind.POD)
        assert rig.stats("pods").errors == 0
        assert rig.cache.bad_objects()["pods"] == 1
        await until(lambda: len(rig.requests(kmock_lib.action.WATCH, PODS)) >= 2)
        # the next watch resumes after the good event, not from a dict turned into text
        assert rig.requests(kmock_lib.action.WATCH, PODS)[1].params["resourceVersion"] == "60"
    finally:
        await _stop(rig)


def test_deeply_nested_watch_line_is_skipped() -> None:
    w = ResourceWatcher(lambda **kw: None, "pods", ClusterMetadata(), WatchSettings(),
                        threading.Event())
    assert w._handle_line("[" * 100_000 + "]" * 100_000, "7") == "7"
    assert w._handle_line(json.dumps({"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": True}}}), "7") == "7"


def test_default_api_client_detects_a_dead_peer_within_30_seconds() -> None:
    """The default client's connections carry TCP keepalive whose give-up time fits the
    30 s after which the watch marks metadata unsynced (the partition itself is injected
    in tests/kernel/test_watch_partition.py)."""
    import socket

    from agent.k8s.client import KEEPALIVE

    api = build_api_client(host="http://127.0.0.1:1")
    opts = {(level, name): value for level, name, value in api.configuration.socket_options}
    assert opts[(socket.SOL_SOCKET, socket.SO_KEEPALIVE)] == 1
    idle = opts[(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)]
    interval = opts[(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)]
    count = opts[(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)]
    assert (idle, interval, count) == KEEPALIVE and idle + interval * count <= 30
    assert opts[(socket.IPPROTO_TCP, socket.TCP_NODELAY)] == 1  # urllib3's default kept


@pytest.mark.asyncio
async def test_a_server_answering_every_watch_with_410_is_not_relisted_in_a_tight_loop(rig: Rig) -> None:
    """Every watch answered 410 Gone (the list's resourceVersion already compacted away,
    a broken proxy): each 410 triggered an immediate full relist, hundreds of full lists
    a second from every node. A 410 after a watch that applied events still relists at
    once; a 410 before any event since the last list backs off like errors (doubling,
    bounded by backoff_max_seconds)."""
    km = rig.km
    km[kmock_lib.action.WATCH, PODS] << (lambda request: kmock_lib.Response(
        status=410, payload={"kind": "Status", "code": 410, "reason": "Gone"}))
    try:
        await start(rig)
        await asyncio.sleep(2.0)
        lists = rig.stats("pods").lists
        # FAST: backoff 0.05 s doubling to 0.2 s: about 12 lists in 2 s; without it, hundreds
        assert 3 <= lists <= 25, lists
        assert rig.synced("pods")  # every list succeeded: the metadata is fresh
        assert rig.stats("nodes").lists == 1
    finally:
        await _stop(rig)


@pytest.mark.asyncio
@pytest.mark.parametrize("body", [{}, {"kind": "Status", "status": "Failure", "code": 500},
                                  {"kind": "PodList", "metadata": {}, "items": {"a": 1}}])
async def test_a_list_answer_that_is_no_list_keeps_the_cache(rig: Rig, body: dict[str, Any]) -> None:
    """A relist replaces the resource as a whole. An HTTP 200 whose body is not a list (a
    Status, ``{}`` from a misbehaving proxy) used to read as "no pods": every pod was
    deleted (its address unknown once the grace ran out) and the resource reported
    synced. It is a failed list now: the cache keeps its pods, the loop retries."""
    km = rig.km
    broken = {"on": False}
    km[kmock_lib.action.LIST, PODS][lambda request: broken["on"]] << (lambda request: body)
    km[kmock_lib.action.WATCH, PODS][lambda request: broken["on"]] << (lambda request: kmock_lib.Response(
        status=410, payload={"kind": "Status", "code": 410, "reason": "Gone"}))
    try:
        await start(rig)
        assert rig.cache.counts()["pods"] == 2
        broken["on"] = True
        rig.watcher.watchers["pods"].interrupt()  # the next watch gets 410: relist
        await until(lambda: rig.stats("pods").errors >= 2)
        assert rig.cache.counts()["pods"] == 2
        assert rig.cache.resolve(ip("10.0.1.5")).name == "web-1"
        assert "not a list" in rig.stats("pods").last_error
        broken["on"] = False
        await until(lambda: rig.stats("pods").lists >= 2 and rig.synced("pods"))
        assert rig.cache.counts()["pods"] == 2
    finally:
        await _stop(rig)


@pytest.mark.asyncio
@pytest.mark.parametrize("page2", [500, 410])
async def test_a_paged_relist_that_fails_on_page_two_deletes_nothing(rig: Rig, page2: int) -> None:
    """Relist after 410 Gone in pages: page 2 fails (500, or 410 for an expired continue
    token). Pods of the unread pages must not be deleted (a half list is not the cluster),
    and the next full list repairs everything."""
    km = rig.km
    state = {"relist": False, "fail": True}
    page1 = {"kind": "PodList", "apiVersion": "v1",
             "metadata": {"resourceVersion": "90", "continue": "tok-2"},
             "items": [k8s.pod("web-1", "10.0.1.5", "n1", noise=True)]}
    page2_ok = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "90"},
                "items": [k8s.pod("stale", "10.0.2.9", "n2", noise=True), k8s.pod("p3", "10.0.1.30", "n1", noise=True)]}

    def tok2(request: Any) -> bool:
        return state["relist"] and request.params.get("continue") == "tok-2"

    km[kmock_lib.action.LIST, PODS][lambda request: state["relist"]
                                    and "continue" not in request.params] << (lambda request: page1)
    km[kmock_lib.action.LIST, PODS][lambda request: tok2(request) and state["fail"]] << (
        lambda request: kmock_lib.Response(status=page2, payload={"kind": "Status", "code": page2}))
    km[kmock_lib.action.LIST, PODS][lambda request: tok2(request) and not state["fail"]] << (
        lambda request: page2_ok)
    km[kmock_lib.action.WATCH, PODS][lambda request: state["relist"] and state["fail"]] << (
        lambda request: kmock_lib.Response(status=410, payload={"kind": "Status", "code": 410}))
    try:
        await start(rig)
        assert rig.cache.resolve(ip("10.0.2.9")).name == "stale"
        state["relist"] = True
        rig.watcher.watchers["pods"].interrupt()
        await until(lambda: len([r for r in rig.requests(kmock_lib.action.LIST, PODS)
                                 if r.params.get("continue") == "tok-2"]) >= 2)
        # the pod only on page 2 is still there, not in the grace cache
        assert rig.cache.counts()["pods"] == 2 and rig.cache.counts()["deleted_ips"] == 0
        rig.clock.t += 600
        assert rig.cache.resolve(ip("10.0.2.9")).name == "stale"
        state["fail"] = False
        await until(lambda: rig.cache.resolve(ip("10.0.1.30")).kind is PeerKind.POD)
        assert rig.cache.counts()["pods"] == 3
    finally:
        await _stop(rig)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.sampled_from(["type", "object", "metadata", "name",
                                                       "namespace", "resourceVersion", "code",
                                                       "message", "status", "spec"]), kids, max_size=4),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "X", None, 5]),
       st.sampled_from(["pods", "nodes", "services", "endpointslices"]), JSON)
def test_any_watch_line_is_applied_skipped_or_a_handled_error(etype: Any, resource: str,
                                                              obj: Any) -> None:
    """Property: a watch line of any shape is applied, skipped or counted as bad; only an
    ERROR event ends the watch, and only with the two exceptions the loop handles."""
    from kubernetes.client.exceptions import ApiException

    from agent.k8s.watch import _Gone

    w = ResourceWatcher(lambda **kw: None, resource, ClusterMetadata(), WatchSettings(),
                        threading.Event())
    line = json.dumps({"type": etype, "object": obj})
    try:
        rv = w._handle_line(line, "7")
    except (_Gone, ApiException):
        assert etype == "ERROR"
        return
    assert etype != "ERROR"  # an ERROR event always ends the watch
    assert isinstance(rv, str)
