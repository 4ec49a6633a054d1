"""agent.datapath.drain: record construction of the drain; and the exactly-once rule applied to
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
    from agent.datapath import drain as drain_module

    assert not hasattr(drain_module, "counted_once")  # one rule, in agent.attribution


def test_fast_delta_equals_constructor() -> None:
    from agent.datapath.drain import _fast_delta

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

    from agent.datapath.abi import VALUE_BY_KIND, FlowKey, FlowValue, addr_to_bytes, overflow_key
    from agent.datapath.drain import FlowTables

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
    t._v4, t._v6 = {}, {}
    t._ifindexes = {}
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


def _tables_with(rows: list[tuple[str, str, int]]) -> object:
    """A FlowTables without maps whose buffers hold rows of (local, remote, packets)."""
    import ctypes as ct

    from agent.datapath.abi import FlowKey, FlowValue, addr_to_bytes
    from agent.datapath.drain import FlowTables

    t = FlowTables.__new__(FlowTables)
    t._keys = (FlowKey * len(rows))()
    t._values = (FlowValue * len(rows))()
    t._overflow_bytes = 0
    t._v4, t._v6 = {}, {}
    t._ifindexes = {}
    for i, (local, remote, packets) in enumerate(rows):
        la, ra = ipaddress.ip_address(local), ipaddress.ip_address(remote)
        ct.memmove(t._keys[i].local, addr_to_bytes(la), 16)
        ct.memmove(t._keys[i].remote, addr_to_bytes(ra), 16)
        t._keys[i].family, t._keys[i].proto = la.version, 6
        t._values[i].bytes, t._values[i].packets = 100 * packets, packets
    return t


def test_convert_shares_address_objects_across_drains() -> None:
    """The address caches live as long as the tables: a second drain with the same
    addresses hands out the very objects of the first (and equal ones, of course)."""
    rows = [("10.1.0.5", "10.2.0.9", 1), ("10.1.0.5", "10.2.0.10", 2),
            ("fd00::5", "2001:db8::1", 3), ("fd00::5", "2001:db8::2", 4)]
    t = _tables_with(rows)
    first = t._convert(4)  # type: ignore[attr-defined]
    assert [(str(d.local), str(d.remote), d.packets) for d in first] == rows
    assert first[0].local is first[1].local and first[2].local is first[3].local
    assert len(t._v4) == 3 and len(t._v6) == 3  # type: ignore[attr-defined]
    second = t._convert(4)  # type: ignore[attr-defined]
    assert second == first
    assert all(a.local is b.local and a.remote is b.remote for a, b in zip(first, second, strict=True))


def test_convert_empties_address_caches_above_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.datapath import drain as drain_module

    rows = [("10.1.0.5", f"10.2.0.{i}", 1) for i in range(1, 6)]  # 6 distinct addresses
    t = _tables_with(rows)
    monkeypatch.setattr(drain_module, "ADDRESS_CACHE_MAX", 6)
    out = t._convert(5)  # type: ignore[attr-defined]
    assert len(t._v4) == 6  # type: ignore[attr-defined]  # at the bound: kept
    monkeypatch.setattr(drain_module, "ADDRESS_CACHE_MAX", 5)
    again = t._convert(5)  # type: ignore[attr-defined]
    assert again == out  # records unaffected
    assert len(t._v4) == 0 and len(t._v6) == 0  # type: ignore[attr-defined]


def _switchable() -> object:
    from agent.datapath.drain import FlowTables

    t = FlowTables.__new__(FlowTables)
    t._active, t._cache_active, t._leftover = 0, 0, False
    return t


def test_switches_of_cache_and_table_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both bpf() updates are in flight at once (so they wait for one grace period): each
    fake switch waits at a two-party barrier, which breaks if they ran one after the other."""
    import threading

    from agent.datapath.drain import FlowTables

    barrier = threading.Barrier(2, timeout=5)
    seen: list[str] = []

    def point_cache(self: FlowTables, index: int) -> None:
        barrier.wait()
        seen.append(f"cache {index}")
        self._cache_active = index

    def point_active(self: FlowTables, index: int) -> None:
        barrier.wait()
        seen.append(f"table {index}")
        self._active = index

    monkeypatch.setattr(FlowTables, "_point_cache", point_cache)
    monkeypatch.setattr(FlowTables, "_point_active", point_active)
    t = _switchable()
    t._switch_both()  # type: ignore[attr-defined]
    assert sorted(seen) == ["cache 1", "table 1"]
    assert (t._active, t._cache_active, t._leftover) == (1, 1, False)  # type: ignore[attr-defined]


def test_failed_cache_switch_keeps_the_switched_table_for_the_next_drain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.datapath.drain import FlowTables
    from agent.errors import RuntimeFailure

    def point_cache(self: FlowTables, index: int) -> None:
        raise RuntimeFailure("cannot switch the active flow cache: EPERM")

    def point_active(self: FlowTables, index: int) -> None:
        self._active = index

    monkeypatch.setattr(FlowTables, "_point_cache", point_cache)
    monkeypatch.setattr(FlowTables, "_point_active", point_active)
    t = _switchable()
    with pytest.raises(RuntimeFailure, match="flow cache"):
        t._switch_both()  # type: ignore[attr-defined]
    # the table did switch: its old one is drained first next time, like after a restart
    assert (t._active, t._cache_active, t._leftover) == (1, 0, True)  # type: ignore[attr-defined]


def test_switches_one_after_the_other_without_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from agent.datapath.drain import FlowTables

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    calls: list[tuple[str, str]] = []

    def point_cache(self: FlowTables, index: int) -> None:
        calls.append(("cache", threading.current_thread().name))
        self._cache_active = index

    def point_active(self: FlowTables, index: int) -> None:
        calls.append(("table", threading.current_thread().name))
        self._active = index

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    monkeypatch.setattr(FlowTables, "_point_cache", point_cache)
    monkeypatch.setattr(FlowTables, "_point_active", point_active)
    t = _switchable()
    t._switch_both()  # type: ignore[attr-defined]
    main = threading.current_thread().name
    assert calls == [("cache", main), ("table", main)]
    assert (t._active, t._cache_active) == (1, 1)  # type: ignore[attr-defined]
