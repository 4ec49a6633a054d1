"""The first hop of a node port, counted on the receiving node's uplink (bpf/uplink.h;
docs/datapath.md, "The first hop of a node port"), against the outside peer's own nftables
counters: exact, on TCX and clsact, with the veth hook's and the cgroup hook's programs;
nothing for externalTrafficPolicy Local, nothing without entry points, and the uplink's
other traffic (the forwarded second hop, the node's pods) never counted there.

A lab of two nodes: a load balancer ``lb`` (outside, zone-a) calls a1's node ports. ``web``
(node port 30080, externalTrafficPolicy Cluster) has its pod on b1: the lab's kube-proxy
emulation on a1 masquerades and forwards it out of the same uplink. ``api`` (30081, Local)
has its pod on a1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.datapath import Datapath, DatapathConfig
from agent.records import FlowDelta, FlowKind
from tests.kernel.test_datapath_restart import pin_dir  # noqa: F401 - fixture
from tools.lab import Lab, Topology

TOPOLOGY = """\
options: {mode: flat, ipv6: true}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: web-b1, namespace: shop, node: b1, app: web, ports: [{port: 8080, name: http}]}
  - {name: api-a1, namespace: shop, node: a1, app: api, ports: [{port: 8080, name: http}]}
services:
  - {name: web, namespace: shop, type: NodePort, externalTrafficPolicy: Cluster,
     selector: {app: web}, ports: [{name: http, port: 80, targetPort: http, nodePort: 30080}]}
  - {name: api, namespace: shop, type: NodePort, externalTrafficPolicy: Local,
     selector: {app: api}, ports: [{name: http, port: 80, targetPort: http, nodePort: 30081}]}
outside:
  - {name: lb, kind: load-balancer, zone: zone-a, type: aws-nlb}
"""
LB = "outside/lb"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab(Topology.from_yaml(TOPOLOGY), server_max_seconds=600).up()
    try:
        yield lab
    finally:
        lab.down()


def _datapath(lab: Lab, hook: str, attach: str = "auto", entry_hops: bool = True) -> Datapath:
    ns, uplink = lab.uplink("a1")
    scope = (ns, lab.pod_netns("api-a1")) if hook == "cgroup" else ()
    dp = Datapath(DatapathConfig(netns=ns, exclude_patterns=(uplink,), uplink_patterns=(uplink,),
                                 hook=hook, attach=attach, scope_netns=scope, entry_hops=entry_hops,
                                 flow_capacity=4096))
    dp.attach()
    return dp


def _entries(deltas: list[FlowDelta]) -> dict[tuple[str, str, int, str], int]:
    out: dict[tuple[str, str, int, str], int] = {}
    for d in deltas:
        if d.is_entry:
            k = (str(d.local), str(d.remote), d.port, d.kind.value)
            out[k] = out.get(k, 0) + d.bytes
    return out


def _calls(lab: Lab, port: int) -> None:
    for fam in (4, 6):
        r = lab.run_flow(LB, lab.node_ip("a1", fam), port, "tcp", request_bytes=300,
                         response_bytes=3000, count=5)
        assert r.failed == 0


@pytest.mark.parametrize(("hook", "attach"), [("veth", "tcx"), ("veth", "clsact"), ("cgroup", "auto")])
def test_the_first_hop_equals_what_the_load_balancer_sent_and_received(lab: Lab, hook: str,
                                                                       attach: str) -> None:
    dp = _datapath(lab, hook, attach)
    try:
        assert dp.uplinks() == (lab.uplink("a1")[1],)
        assert dp.uplink_mode == ("clsact" if attach == "clsact" else "tcx")
        a1 = [lab.node_ip("a1", 4), lab.node_ip("a1", 6)]
        dp.set_entry_points([(a, 30080, 6) for a in a1])  # web only: api is Local
        dp.drain()
        lab.reset_ground_truth()
        _calls(lab, 30080)
        _calls(lab, 30081)
        got = _entries(dp.drain())
    finally:
        dp.close()
    truth = lab.outside_client_truth()
    lb = {fam: str(lab.topology.peer("lb").address(fam)) for fam in (4, 6)}
    want = {}
    for addr in a1:
        fam = addr.version
        for direction in ("request", "response"):
            n = truth[(LB, addr, 30080, direction)]
            assert n > 0
            want[(str(addr), lb[fam], 30080, direction)] = n
    # every byte of the load balancer's web calls, once; none of api's (Local); none of
    # the forwarded second hop, which crossed the same uplink
    assert got == want


def test_without_entry_points_or_with_entry_hops_off_nothing_is_counted_on_the_uplink(lab: Lab) -> None:
    dp = _datapath(lab, "veth")
    try:
        dp.drain()
        _calls(lab, 30080)
        assert _entries(dp.drain()) == {}
    finally:
        dp.close()
    off = _datapath(lab, "veth", entry_hops=False)
    try:
        assert off.uplinks() == () and off.uplink_mode is None
        with pytest.raises(KeyError):
            off._fns["zm_tcx_up_in"]
    finally:
        off.close()


def test_the_uplink_programs_go_with_the_datapath_and_the_veth_programs_stay_on_pods(lab: Lab) -> None:
    from tests.kernel._dp_fixtures import tcx_chain

    ns, uplink = lab.uplink("a1")
    dp = _datapath(lab, "veth", "tcx")
    try:
        stats = dp.stats()
        assert stats.uplinks == (uplink,) and uplink not in stats.attached and stats.attached
        assert (tcx_chain(ns, uplink, "ingress"), tcx_chain(ns, uplink, "egress")) == (
            ["zm_tcx_up_in"], ["zm_tcx_up_out"])
    finally:
        dp.close()
    assert tcx_chain(ns, uplink, "ingress") == tcx_chain(ns, uplink, "egress") == []


def test_request_and_response_kinds_are_marked_as_entry_hops(lab: Lab) -> None:
    dp = _datapath(lab, "veth")
    try:
        dp.set_entry_points([(lab.node_ip("a1", 4), 30080, 6)])
        dp.drain()
        lab.run_flow(LB, lab.node_ip("a1", 4), 30080, "tcp", count=2)
        entries = [d for d in dp.drain() if d.is_entry]
    finally:
        dp.close()
    assert {d.kind for d in entries} == {FlowKind.REQUEST, FlowKind.RESPONSE}
    assert all(d.local_port == d.port == 30080 and d.ifindex for d in entries)


def test_a_restarted_agent_takes_the_pinned_uplink_links_over_and_cleanup_removes_them(
        lab: Lab, pin_dir: str) -> None:  # noqa: F811
    """With pins, SIGTERM (release) leaves the uplink links counting; the next agent swaps
    its program into them (never a second link) and keeps the entry set; cleanup detaches
    them and unlinks their pins (zm_uplink_<ifindex>_<side>)."""
    import os

    from tests.kernel._dp_fixtures import tcx_chain

    pin = pin_dir
    ns, uplink = lab.uplink("a1")
    a1 = lab.node_ip("a1", 4)

    def datapath() -> Datapath:
        dp = Datapath(DatapathConfig(netns=ns, exclude_patterns=(uplink,), uplink_patterns=(uplink,),
                                     pin_path=pin, flow_capacity=4096))
        dp.attach()
        return dp

    first = datapath()
    first.set_entry_points([(a1, 30080, 6)])
    first.drain()
    lab.reset_ground_truth()
    first.release()
    assert sorted(p for p in os.listdir(pin) if p.startswith("zm_uplink_"))  # pinned
    # while no agent runs the kernel keeps counting the first hop into the pinned tables
    lab.run_flow(LB, a1, 30080, "tcp", count=3)
    second = datapath()
    try:
        assert second.reused and second.stats().entries == 1  # the entry set was kept
        assert (tcx_chain(ns, uplink, "ingress"), tcx_chain(ns, uplink, "egress")) == (
            ["zm_tcx_up_in"], ["zm_tcx_up_out"])                # taken over, not doubled
        got = _entries(second.drain())
    finally:
        second.release()
    sent = lab.outside_client_truth()
    lb = str(lab.topology.peer("lb").address(4))
    for d in ("request", "response"):  # every byte of the calls made while no agent ran
        assert got[(str(a1), lb, 30080, d)] == sent[(LB, a1, 30080, d)] > 0
    removed = Datapath.cleanup(pin, ns)
    assert {p for p in removed.links if p.startswith("zm_uplink_")}
    assert tcx_chain(ns, uplink, "ingress") == tcx_chain(ns, uplink, "egress") == []
