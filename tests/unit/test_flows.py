"""agent.flows: record construction of the drain; and the exactly-once rule applied to
the deltas it produces (:func:`agent.attribution.counted_here`, which the kernel tests in
tests/kernel/test_datapath*.py apply to real drained deltas)."""

from __future__ import annotations

import ipaddress

import pytest

from agent.attribution import counted_here
from agent.records import FlowDelta, FlowKind

POD = ipaddress.ip_address("10.1.0.5")
PEER = ipaddress.ip_address("10.2.0.7")


@pytest.mark.parametrize("kind", [FlowKind.REQUEST, FlowKind.RESPONSE])
@pytest.mark.parametrize("pod,frontend", [(True, True), (True, False), (False, False)])
def test_service_deltas_always_kept(kind: FlowKind, pod: bool, frontend: bool) -> None:
    assert counted_here(kind, remote_is_pod=pod, remote_is_frontend=frontend)


@pytest.mark.parametrize("kind", [FlowKind.EGRESS, FlowKind.INGRESS])
def test_client_side_copy_of_service_traffic_dropped(kind: FlowKind) -> None:
    assert not counted_here(kind, remote_is_pod=True, remote_is_frontend=True)
    assert not counted_here(kind, remote_is_pod=False, remote_is_frontend=True)


def test_pod_to_pod_counted_outbound_only() -> None:
    assert counted_here(FlowKind.EGRESS, remote_is_pod=True, remote_is_frontend=False)
    assert not counted_here(FlowKind.INGRESS, remote_is_pod=True, remote_is_frontend=False)


def test_non_pod_remote_counted_both_directions() -> None:
    assert counted_here(FlowKind.EGRESS, remote_is_pod=False, remote_is_frontend=False)
    assert counted_here(FlowKind.INGRESS, remote_is_pod=False, remote_is_frontend=False)


def test_counted_once_is_gone_from_flows() -> None:
    import agent.flows

    assert not hasattr(agent.flows, "counted_once")  # one rule, in agent.attribution


def test_fast_delta_equals_constructor() -> None:
    from agent.flows import _fast_delta

    args = (FlowKind.RESPONSE, POD, PEER, 8080, 17, 12345, 9)
    fast = _fast_delta(*args)
    assert fast == FlowDelta(*args)
    assert hash(fast) == hash(FlowDelta(*args))
    with pytest.raises(AttributeError):
        fast.bytes = 1  # type: ignore[misc]


def test_convert_builds_the_records_the_constructor_would() -> None:
    """FlowTables._convert (the drain's hot loop, slots set directly, GC paused) against
    FlowDelta's own constructor, over buffers laid out as the kernel returns them."""
    import ctypes as ct
    import gc
    import ipaddress
    import socket

    from agent.bpf_types import VALUE_BY_KIND, FlowKey, FlowValue, addr_to_bytes, overflow_key
    from agent.flows import FlowTables

    rows = [
        (FlowKind.REQUEST, "10.1.0.5", "10.2.0.9", 8080, 6, 1500, 3),
        (FlowKind.EGRESS, "fd00::5", "2001:db8::1", 443, 17, 900, 2),
        (FlowKind.INGRESS, "10.1.0.5", "10.2.0.9", 0, 1, 84, 1),
        (FlowKind.RESPONSE, "10.1.0.5", "10.2.0.10", 8080, 6, 0, 0),  # idle entry: skipped
    ]
    t = FlowTables.__new__(FlowTables)
    t._keys = (FlowKey * 6)()
    t._values = (FlowValue * 6)()
    t._overflow_bytes = 0
    for i, (kind, local, remote, port, proto, nbytes, packets) in enumerate(rows):
        k = t._keys[i]
        la, ra = ipaddress.ip_address(local), ipaddress.ip_address(remote)
        ct.memmove(k.local, addr_to_bytes(la), 16)
        ct.memmove(k.remote, addr_to_bytes(ra), 16)
        k.port, k.proto, k.family = socket.htons(port), proto, la.version
        k.kind = VALUE_BY_KIND[kind]
        t._values[i].bytes, t._values[i].packets = nbytes, packets
    t._keys[4] = overflow_key(FlowKind.EGRESS, 6)
    t._values[4].bytes, t._values[4].packets = 777, 5
    t._keys[5] = overflow_key(FlowKind.REQUEST, 4)  # seeded, never hit
    enabled = gc.isenabled()
    out = t._convert(6)
    assert gc.isenabled() == enabled
    expected = [FlowDelta(kind, ipaddress.ip_address(lo), ipaddress.ip_address(re), port, proto, b, p)
                for kind, lo, re, port, proto, b, p in rows[:3]]
    expected.append(FlowDelta(FlowKind.EGRESS, ipaddress.IPv6Address(0), ipaddress.IPv6Address(0),
                              0, 0, 777, 5, True))
    assert out == expected
    assert all(type(d) is FlowDelta for d in out)
    assert hash(out[0]) == hash(expected[0])
    with pytest.raises(AttributeError):  # frozen like any FlowDelta
        out[0].bytes = 1  # type: ignore[misc]
    assert t._entries == 4  # flow entries in the table, overflow entries excluded
    assert t._overflow_bytes == 777
