"""agent.datapath.coverage: counted against carried bytes, the window ratio, and the loop's
log lines when a hook starts and stops being starved."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.datapath import InterfaceBytes
from agent.datapath.coverage import (
    MIN_CARRIED_BYTES,
    MIN_TCP_PACKETS,
    HookCoverage,
    carried_l3,
    off_node_bytes,
    tcp_packets,
)
from agent.exporter import Exporter
from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.loop import AgentLoop
from agent.records import FlowDelta, FlowKind
from tests.fixtures.fakes import FakeDatapath
from tests.unit.cli.test_agent import ip


def dev(rx: int, rxp: int, tx: int, txp: int) -> InterfaceBytes:
    return InterfaceBytes("zmveth", rx, rxp, tx, txp)


def test_carried_is_l3_bytes_of_both_directions() -> None:
    # 10 frames of 1014 L2 bytes each way: 10 * 1000 L3 bytes each way
    assert carried_l3([dev(10140, 10, 10140, 10)]) == 20000
    # counters that wrapped or were reset never make a negative
    assert carried_l3([dev(0, 3, 50, 1)]) == 36


def test_ratio_is_judged_only_above_the_minimum_and_unseen_sums_the_gaps() -> None:
    cov = HookCoverage(window_seconds=30)
    st = cov.add(0.0, 0, {})
    assert math.isnan(st.ratio) and st.counted_bytes == 0  # no interface counters yet
    st = cov.add(10.0, 500, {1: dev(1014 * 5, 5, 0, 0)})  # 5000 carried, below the minimum
    assert math.isnan(st.ratio) and not st.starved
    assert (st.counted_bytes, st.carried_bytes, st.unseen_bytes) == (500, 5000, 4500)
    big = MIN_CARRIED_BYTES
    st = cov.add(20.0, big, {1: dev(big + 14, 1, 0, 0)})
    assert st.ratio == pytest.approx((500 + big) / (5000 + big))
    assert not st.starved and st.unseen_bytes == 4500
    # the hook starves: the devices go on carrying, ours count nothing
    st = cov.add(30.0, 0, {1: dev(4 * big + 14, 1, 0, 0)})
    st = cov.add(40.0, 0, {1: dev(4 * big + 14, 1, 0, 0)})
    assert st.starved and st.ratio == pytest.approx(big / (9 * big))  # t=10 left the window
    assert st.unseen_bytes == 4500 + 8 * big
    # GSO: ours above the device's own count is covered, not unseen
    st = cov.add(80.0, 2 * big, {1: dev(big + 14, 1, 0, 0)})
    assert st.ratio == 2.0 and not st.starved and st.unseen_bytes == 4500 + 8 * big
    assert st.counted_bytes == 500 + 3 * big


def _loop() -> tuple[AgentLoop, FakeDatapath, Exporter]:
    cache = ClusterMetadata()
    dp = FakeDatapath()
    exp = Exporter(version="t")
    clock = iter(float(t) for t in range(1000, 2000, 10))
    return AgentLoop("nb", dp, cache, HintModel(cache), exp, interval=10,
                     clock=lambda: next(clock)), dp, exp


def _delta(nbytes: int) -> FlowDelta:
    return FlowDelta(FlowKind.EGRESS, ip("10.244.2.20"), ip("10.244.1.10"), 80, 6, nbytes, 1)


def test_the_loop_logs_starvation_once_and_exports_the_gap(caplog: pytest.LogCaptureFixture) -> None:
    loop, dp, exp = _loop()
    big = MIN_CARRIED_BYTES
    dp.pending = [_delta(big)]
    dp.interfaces = {7: dev(big + 14, 1, 0, 0)}
    with caplog.at_level(logging.INFO, logger="agent.loop"):
        loop.tick()
        for _ in range(3):  # the devices carry, nothing reaches our programs
            dp.interfaces = {7: dev(4 * big + 14, 1, 0, 0)}
            loop.tick()
        dp.pending = [_delta(40 * big)]
        dp.interfaces = {7: dev(40 * big + 14, 1, 0, 0)}
        loop.tick()
    low = [r for r in caplog.records if r.getMessage().startswith("hook coverage low")]
    assert len(low) == 1 and "counted 20% " in low[0].getMessage()
    assert [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()] == [
        "hook coverage recovered"]
    got = {s.name: s.value for f in text_string_to_metric_families(generate_latest(exp.registry()).decode())
           for s in f.samples if s.name.startswith(("zonemeter_hook_", "zonemeter_interface_"))
           and s.name != "zonemeter_hook_tcp_direction_ratio"}  # no TCP here: NaN
    assert got == {"zonemeter_hook_unseen_bytes_total": 12 * big, "zonemeter_interface_bytes_total": 53 * big,
                   "zonemeter_hook_counted_bytes_total": 41 * big, "zonemeter_hook_coverage_ratio": 41 / 53}


def test_veth_hook_coverage_leaves_out_the_uplinks_first_hops() -> None:
    """The first hop of a node port is counted on an uplink (bpf/uplink.h), which the veth
    hook's comparison does not read: those bytes are not compared with the veths."""
    loop, dp, exp = _loop()
    big = MIN_CARRIED_BYTES
    entry = FlowDelta(FlowKind.REQUEST, ip("10.1.0.2"), ip("203.0.113.9"), 30080, 6, 10 * big, 1,
                      local_port=30080, ifindex=2)
    assert entry.is_entry
    dp.interfaces = {7: dev(big + 14, 1, 0, 0)}  # what the veth carried in the interval
    dp.pending = [_delta(big), entry]
    loop.tick()
    st = loop.coverage.state()
    assert (st.counted_bytes, st.carried_bytes, st.ratio) == (big, big, 1.0)


def test_interface_counter_errors_never_cost_an_interval(caplog: pytest.LogCaptureFixture) -> None:
    loop, dp, _ = _loop()

    def broken() -> dict[int, InterfaceBytes]:
        raise OSError("netlink gone")

    dp.interface_bytes = broken  # type: ignore[method-assign]
    dp.pending = [_delta(100)]
    res = loop.tick()
    assert res.bytes == 100 and loop.attributor.totals().workload_bytes
    assert any("interface counters failed" in r.getMessage() for r in caplog.records)


def test_off_node_bytes_leave_out_peers_on_this_node() -> None:
    where = {ip("10.244.1.10"): "nb", ip("10.0.0.2"): "nb", ip("10.244.2.20"): "nc",
             ip("10.0.0.3"): "nc"}
    calls: list[object] = []

    def node_of(addr: object) -> str | None:
        calls.append(addr)
        return where.get(addr)  # type: ignore[call-overload]

    def d(remote: str, nbytes: int) -> FlowDelta:
        return FlowDelta(FlowKind.EGRESS, ip("10.244.1.11"), ip(remote), 80, 6, nbytes, 1)

    deltas = [d("10.244.1.10", 1), d("10.0.0.2", 2),  # a pod of this node, the node itself
              d("10.244.2.20", 4), d("10.0.0.3", 8),  # another node's pod, another node
              d("10.96.0.10", 16),  # a ClusterIP: may have gone off the node, taken as such
              d("203.0.113.9", 32), d("203.0.113.9", 64)]  # outside the cluster
    assert off_node_bytes(deltas, "nb", node_of) == 4 + 8 + 16 + 32 + 64
    assert len(calls) == 6  # one lookup per remote address


def test_the_loop_on_the_cgroup_hook_compares_off_node_bytes_with_the_uplinks(
        caplog: pytest.LogCaptureFixture) -> None:
    from agent.datapath import DatapathConfig
    from tests.fixtures.k8s import node, pod

    cache = ClusterMetadata()
    cache.replace("nodes", [node("nb", "zone-b", internal="10.0.0.2"),
                            node("nc", "zone-c", internal="10.0.0.3")])
    cache.replace("pods", [pod("p-b", "10.244.1.10", "nb"), pod("p-c", "10.244.2.20", "nc")])
    dp = FakeDatapath(DatapathConfig(hook="cgroup"))
    exp = Exporter(version="t")
    clock = iter(float(t) for t in range(1000, 2000, 10))
    loop = AgentLoop("nb", dp, cache, HintModel(cache), exp, interval=10, clock=lambda: next(clock))
    big = MIN_CARRIED_BYTES

    def to(remote: str, nbytes: int) -> FlowDelta:
        return FlowDelta(FlowKind.EGRESS, ip("10.244.1.10"), ip(remote), 80, 6, nbytes, 1)

    # same-node traffic is counted at both sockets and crosses no uplink: left out
    dp.pending = [to("10.244.2.20", big), to("10.0.0.2", 5 * big)]
    dp.interfaces = {2: InterfaceBytes("eth0", big + 14, 1, 0, 0)}
    with caplog.at_level(logging.INFO, logger="agent.loop"):
        loop.tick()
        assert loop.coverage.state().ratio == 1.0
        # sockets outside the hook's cgroup: the uplink carries, ours count only local pairs
        for _ in range(3):
            dp.pending = [to("10.0.0.2", 5 * big)]
            dp.interfaces = {2: InterfaceBytes("eth0", 4 * big + 14, 1, 0, 0)}
            loop.tick()
    st = loop.coverage.state()
    assert st.starved and st.counted_bytes == big and st.carried_bytes == 13 * big
    low = [r for r in caplog.records if r.getMessage().startswith("hook coverage low")]
    assert len(low) == 1 and "uplinks" in low[0].getMessage() and "--cgroup-root" in low[0].getMessage()
    got = {s.name: s.labels for f in text_string_to_metric_families(generate_latest(exp.registry()).decode())
           for s in f.samples if s.name == "zonemeter_datapath_info"}
    assert got == {"zonemeter_datapath_info": {"hook": "cgroup", "attach": "cgroup", "requested": "cgroup"}}


def _tcp(kind: FlowKind, packets: int, proto: int = 6) -> FlowDelta:
    return FlowDelta(kind, ip("10.244.1.10"), ip("10.244.2.20"), 80, proto, packets * 100, packets)


def test_tcp_packets_by_direction_into_and_out_of_local_sockets() -> None:
    deltas = [_tcp(FlowKind.REQUEST, 5), _tcp(FlowKind.INGRESS, 7), _tcp(FlowKind.RESPONSE, 11),
              _tcp(FlowKind.EGRESS, 13), _tcp(FlowKind.EGRESS, 1000, proto=17)]  # UDP: not judged
    assert tcp_packets(deltas) == (12, 24)


def test_one_way_tcp_is_starved_although_the_bytes_match() -> None:
    """bpf_redirect_peer into the pods: the veth's tx counters and our egress program both
    miss the packets into the pod; bytes agree, TCP goes one way."""
    cov = HookCoverage(window_seconds=30)
    big = MIN_CARRIED_BYTES
    st = cov.add(0.0, 2 * big, {1: dev(2 * big + 14, 1, 0, 0)}, (0, MIN_TCP_PACKETS - 1))
    assert st.ratio == 1.0 and math.isnan(st.tcp_direction_ratio) and not st.starved  # too few yet
    st = cov.add(10.0, big, {1: dev(big + 14, 1, 0, 0)}, (0, 1))
    assert st.ratio == 1.0 and st.tcp_direction_ratio == 0.0 and st.starved
    # both ways again (a GRO-merged stream: one ACK per 362 segments is healthy)
    st = cov.add(40.0, big, {1: dev(big + 14, 1, 0, 0)}, (3 * MIN_TCP_PACKETS, 3 * MIN_TCP_PACKETS // 300))
    assert st.tcp_direction_ratio == pytest.approx(1 / 300) and not st.starved
    # an interval without interface counters still counts for the direction
    st = cov.add(80.0, 0, {}, (0, MIN_TCP_PACKETS))
    assert math.isnan(st.ratio) and st.tcp_direction_ratio == 0.0 and st.starved


def test_the_loop_logs_one_way_tcp(caplog: pytest.LogCaptureFixture) -> None:
    loop, dp, exp = _loop()
    big = MIN_CARRIED_BYTES
    with caplog.at_level(logging.INFO, logger="agent.loop"):
        for _ in range(3):  # out of the pod only, as counted and as the veth's counters say
            dp.pending = [_tcp(FlowKind.EGRESS, MIN_TCP_PACKETS)]
            dp.interfaces = {7: dev(big + 14, 1, 0, 0)}
            loop.tick()
        dp.pending = [_tcp(FlowKind.EGRESS, MIN_TCP_PACKETS), _tcp(FlowKind.INGRESS, 2 * MIN_TCP_PACKETS)]
        dp.interfaces = {7: dev(big + 14, 1, 0, 0)}
        loop.tick()
    low = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hook coverage low")]
    assert len(low) == 1 and "one direction only" in low[0] and "--hook cgroup" in low[0]
    assert any(r.getMessage() == "hook coverage recovered" for r in caplog.records)
    got = {s.name: s.value for f in text_string_to_metric_families(generate_latest(exp.registry()).decode())
           for s in f.samples if s.name == "zonemeter_hook_tcp_direction_ratio"}
    assert got == {"zonemeter_hook_tcp_direction_ratio": 2 / 4}
