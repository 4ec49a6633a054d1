"""A server pod replaced under a watch (``--kubernetes real``, docs/lab.md "What the real
components showed"): the metadata changes between two drains, concurrently with the
traffic, so a drain attributes bytes the kernel counted *before* the change with the
metadata *after* it. Driven with the real cache (``ClusterMetadata`` behind
``MetadataAdapter``) and the agent loop's order per tick: endpoint map written from the
metadata, then drain, then attribution (agent/loop.py ``AgentLoop.tick``)."""

from __future__ import annotations

import ipaddress

from agent.attribution import Attributor, ServiceKey
from agent.k8s.resolve import MetadataAdapter
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock
from tests.unit.k8s.test_cache import make

ip = ipaddress.ip_address
SERVER, CLIENT = ip("10.0.1.10"), ip("10.0.2.5")   # the endpoint on n1, a client pod on n2
REQUEST_BYTES, RESPONSE_BYTES = 1144, 4000          # one exchange: 5,144 L3 bytes


class NoHints:
    def proxy_view(self, namespace: str, service: str, node: str) -> None:
        return None


def _slice(*addresses: str) -> dict:  # type: ignore[type-arg]
    return k8s.endpointslice("web-x1", "web", [k8s.endpoint(a, "zone-a", "n1") for a in addresses])


def _exchange(kind_in: FlowKind, kind_out: FlowKind, ifindex: int, local_port: int = 0) -> list[FlowDelta]:
    """One connection's two deltas at the server's veth, as the kernel counts them."""
    return [FlowDelta(kind_in, SERVER, CLIENT, 8080 if not local_port else 41000, 6,
                      REQUEST_BYTES, 3, ifindex=ifindex, local_port=local_port),
            FlowDelta(kind_out, SERVER, CLIENT, 8080 if not local_port else 41000, 6,
                      RESPONSE_BYTES, 3, ifindex=ifindex, local_port=local_port)]


def _cluster(clock: Clock):  # type: ignore[no-untyped-def]
    c = make(clock)
    c.apply("services", "ADDED", k8s.service("web", cluster_ip="10.96.1.1"))
    c.apply("pods", "ADDED", k8s.pod("client", str(CLIENT), "n2", namespace="shop"))
    c.apply("pods", "ADDED", k8s.pod("web-old", str(SERVER), "n1", namespace="shop"))
    c.apply("endpointslices", "ADDED", _slice(str(SERVER)))
    return c


def _service_bytes(t) -> int:  # type: ignore[no-untyped-def]
    return sum(v for k, v in t.service_bytes.items() if (k.namespace, k.service) == ("shop", "web"))


def _balanced(t) -> bool:  # type: ignore[no-untyped-def]
    return t.bytes_seen == (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
                            + sum(t.unattributed_bytes.values()) + sum(t.skipped_bytes.values())
                            + t.held_bytes)


def test_last_exchanges_of_a_removed_endpoint_stay_service_bytes() -> None:
    """The old pod's last exchanges: classified request/response by the kernel (its map
    still had the endpoint), drained after the watch removed the endpoint from the slice.
    They are the Service's bytes, as the lab's ground truth says (the client's node skipped
    its copy as ``clusterip_client_copy``); before the fix they went to
    ``unattributed{endpoint_without_service}``, in no Service series cluster-wide."""
    clock = Clock(1000)
    c = _cluster(clock)
    a = Attributor("n1", MetadataAdapter(c), NoHints(), hold_unresolved_seconds=60)
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7), 1001)
    # the pod goes: the controller drops its endpoint while in-flight exchanges finish
    clock.t = 1001.5
    c.apply("pods", "DELETED", k8s.pod("web-old", str(SERVER), "n1", namespace="shop"))
    c.apply("endpointslices", "MODIFIED", _slice())
    # counted under the old kernel map (request/response), and the ones after the agent
    # removed the endpoint from the map (ingress/egress with the pod's port), drained now
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7)
                + _exchange(FlowKind.INGRESS, FlowKind.EGRESS, 7, local_port=8080), 1002)
    t = a.totals()
    assert _balanced(t)
    assert not t.unattributed_bytes.get("endpoint_without_service")
    assert not t.skipped_bytes.get("pod_peer_ingress") and not t.workload_bytes
    assert t.held_bytes == 0
    assert _service_bytes(t) == 3 * (REQUEST_BYTES + RESPONSE_BYTES)
    assert t.service_bytes[ServiceKey("shop", "web", "80", "zone-b", "zone-a", "cross_zone",
                                      "request", "pod", "none")] == 3 * REQUEST_BYTES


def test_new_pod_reusing_the_address_learnt_one_drain_late() -> None:
    """The new pod (same address, new veth) serves before the agent's watch reports it or
    its endpoint: its first exchanges (ingress/egress with the pod's port, the kernel map
    lacking the endpoint) are held, then counted once as the Service's."""
    clock = Clock(1000)
    c = _cluster(clock)
    a = Attributor("n1", MetadataAdapter(c), NoHints(), hold_unresolved_seconds=60)
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7), 1001)
    clock.t = 1001.5
    c.apply("pods", "DELETED", k8s.pod("web-old", str(SERVER), "n1", namespace="shop"))
    c.apply("endpointslices", "MODIFIED", _slice())
    a.attribute(_exchange(FlowKind.INGRESS, FlowKind.EGRESS, 9, local_port=8080), 1002)
    assert _balanced(a.totals())
    clock.t = 1002.5
    c.apply("pods", "ADDED", k8s.pod("web-new", str(SERVER), "n1", namespace="shop"))
    a.attribute(_exchange(FlowKind.INGRESS, FlowKind.EGRESS, 9, local_port=8080), 1003)
    assert _balanced(a.totals())
    clock.t = 1003.5
    c.apply("endpointslices", "MODIFIED", _slice(str(SERVER)))
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 9), 1004)
    t = a.totals()
    assert _balanced(t) and t.held_bytes == 0
    assert not t.unattributed_bytes.get("endpoint_without_service")
    assert not t.skipped_bytes.get("pod_peer_ingress") and not t.workload_bytes
    assert _service_bytes(t) == 4 * (REQUEST_BYTES + RESPONSE_BYTES)


def test_an_endpoint_gone_longer_than_the_grace_is_without_service() -> None:
    clock = Clock(1000)
    c = _cluster(clock)
    a = Attributor("n1", MetadataAdapter(c), NoHints())
    c.apply("endpointslices", "MODIFIED", _slice())
    clock.t = 1000 + c.settings.grace_seconds + 1
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7), clock.t)
    t = a.totals()
    assert t.unattributed_bytes["endpoint_without_service"] == REQUEST_BYTES + RESPONSE_BYTES
    assert _balanced(t)


class FiltersEverything:
    """kube-proxy on every node filters by zone and selects no endpoint address: every
    judged Service byte would be hint-ignored."""

    def proxy_view(self, namespace: str, service: str, node: str):  # type: ignore[no-untyped-def]
        from agent.records import ProxyView
        return ProxyView("PreferSameZone", frozenset(), "cluster")


def test_a_removed_endpoints_bytes_are_not_judged_by_hints() -> None:
    """After the removal the hint model lists the endpoint in no selection: the last
    exchanges are the Service's, but not hint-ignored (the selection they were sent under
    is gone); a listed endpoint is judged as before."""
    clock = Clock(1000)
    c = _cluster(clock)
    a = Attributor("n1", MetadataAdapter(c), FiltersEverything())
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7), 1001)
    assert sum(a.totals().hint_ignored_bytes.values()) == REQUEST_BYTES + RESPONSE_BYTES
    c.apply("endpointslices", "MODIFIED", _slice())
    a.attribute(_exchange(FlowKind.REQUEST, FlowKind.RESPONSE, 7), 1002)
    t = a.totals()
    assert _service_bytes(t) == 2 * (REQUEST_BYTES + RESPONSE_BYTES)
    assert sum(t.hint_ignored_bytes.values()) == REQUEST_BYTES + RESPONSE_BYTES
