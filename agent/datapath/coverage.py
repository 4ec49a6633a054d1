"""Hook coverage: what our programs counted against what the interfaces carried.

A data plane that moves packets past our hook (a TCX program in front of a clsact filter
that returns a verdict, ``bpf_redirect_peer`` skipping the host veth) leaves the devices'
own counters growing while ours stand still. Comparing the two per drain interval turns
that silent zero into a number and an alarm (docs/datapath.md, "Interface counters";
the alert ``ZonemeterHookStarved`` in deploy/daemonset/monitoring).

Which bytes are compared depends on the hook:

* veth: every byte counted against the hooked veths' L3 bytes (both count each packet
  once, on the same device);
* cgroup: the bytes counted for peers off the node (:func:`off_node_bytes`) against the
  node's uplinks' L3 bytes: a socket's packet to or from another machine crosses an
  uplink once, and is counted once, at that socket; packets between two sockets of the
  node cross no uplink and are counted at both ends, so they are left out of both sides.

A data plane can also starve one direction only, and the devices' own counters with it:
``bpf_redirect_peer`` into a pod (Cilium host routing, the lab's bypass plane) skips the
host veth's transmit path, so neither our program nor the veth's ``tx`` counters see the
packets *into* the pod, while our TCX link, first on the veth's ingress, still counts
every packet *out of* it. The byte comparison then reads about 1. TCP cannot be one-way:
every receiver acknowledges, so the TCP packets counted into and out of local sockets
(:func:`tcp_packets`) are compared too (:data:`ONE_WAY_RATIO`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from agent.records import CoverageState, FlowDelta, FlowKind, IPAddress

#: Ethernet header bytes the device counts per frame and our L3 counting does not
ETH_HLEN = 14
#: the window of :attr:`CoverageState.ratio`, seconds
WINDOW_SECONDS = 300.0
#: below this many carried L3 bytes in the window the ratio is not judged (NaN): a few
#: ARP frames on an idle node are no evidence either way
MIN_CARRIED_BYTES = 64 * 1024
#: a window ratio below this is "starved" (logged once per episode; the alert reads the
#: counters with its own threshold)
STARVED_RATIO = 0.5
#: below this many TCP packets (the busier direction) in the window the direction ratio is
#: not judged (NaN)
MIN_TCP_PACKETS = 1000
#: a TCP direction ratio below this is one-way, i.e. starved. Receivers acknowledge at
#: least every second full-sized segment (RFC 9293, 3.8.6.3; RFC 5681, 4.2), but the
#: receiving stack sees a GRO super-packet as one segment: up to 512 KiB with BIG TCP
#: (GRO_MAX_SIZE, include/linux/netdevice.h), 362 segments of a 1,448-byte MSS, may get a
#: single ACK, while we count its wire segments. Healthy traffic stays above 1/362 =
#: 0.0028; a starved direction is 0
ONE_WAY_RATIO = 0.001
#: kinds counted on the way into a local socket or pod, and on the way out of one
_INTO = (FlowKind.REQUEST, FlowKind.INGRESS)
_OUT_OF = (FlowKind.RESPONSE, FlowKind.EGRESS)
_TCP = 6


class InterfaceCounters(Protocol):
    """One interface's counters between two drains (:class:`agent.datapath.InterfaceBytes`)."""

    @property
    def rx_bytes(self) -> int: ...
    @property
    def rx_packets(self) -> int: ...
    @property
    def tx_bytes(self) -> int: ...
    @property
    def tx_packets(self) -> int: ...


def carried_l3(counters: Iterable[InterfaceCounters]) -> int:
    """L3 bytes the interfaces carried in both directions: ``bytes - 14 * packets`` per
    direction and device (floored at 0), non-IP frames (ARP) included.

    Args:
        counters: per-device L2 byte and frame counts of one interval (``IFLA_STATS64``).
    """
    total = 0
    for c in counters:
        total += max(0, c.rx_bytes - ETH_HLEN * c.rx_packets)
        total += max(0, c.tx_bytes - ETH_HLEN * c.tx_packets)
    return total


def tcp_packets(deltas: Iterable[FlowDelta]) -> tuple[int, int]:
    """TCP packets (wire segments) the deltas counted ``(into, out_of)`` local sockets or
    pods: request and ingress kinds, response and egress kinds."""
    into = out = 0
    for d in deltas:
        if d.protocol == _TCP:
            if d.kind in _INTO:
                into += d.packets
            elif d.kind in _OUT_OF:
                out += d.packets
    return into, out


def off_node_bytes(deltas: Iterable[FlowDelta], node: str,
                   node_of: Callable[[IPAddress], str | None]) -> int:
    """L3 bytes of the deltas whose remote side is not on this node: what the cgroup hook
    counted that crossed one of the node's uplinks.

    A remote is on the node when the metadata puts it there (``node_of``: a pod of this
    node, or this node's address, which host-network pods share). Every other remote is
    taken to be off the node: other nodes' pods, other machines, and also a ClusterIP
    (a pod's copy before kube-proxy's DNAT: the backend may be local), another local
    address of the node the Node object does not list (a CNI gateway), or a new pod the
    metadata does not know yet. Each of these can only raise the counted side, so the
    comparison errs towards "covered", never towards a false alarm.

    Args:
        deltas: one drain's deltas.
        node: this node's name.
        node_of: address -> the name of the node it is on, or None
            (:meth:`agent.k8s.cache.ClusterMetadata.node_of`).
    """
    seen: dict[IPAddress, bool] = {}
    total = 0
    for d in deltas:
        away = seen.get(d.remote)
        if away is None:
            away = seen[d.remote] = node_of(d.remote) != node
        if away:
            total += d.bytes
    return total


class HookCoverage:
    """Accumulates :class:`CoverageState` over drain intervals.

    Node-wide, not per device: a delta carries addresses, not the device it was counted
    on. An interface attached during an interval has no counters for it yet, so its bytes
    raise ``counted`` only: that errs towards "covered", never towards a false alarm.
    Not thread-safe (the agent loop owns it).
    """

    def __init__(self, window_seconds: float = WINDOW_SECONDS) -> None:
        self.window_seconds = window_seconds
        # (at, counted, carried or None without interface counters, tcp into, tcp out of)
        self._window: deque[tuple[float, int, int | None, int, int]] = deque()
        self._state = CoverageState()

    def add(self, at: float, counted: int, interfaces: Mapping[int, InterfaceCounters],
            tcp: tuple[int, int] = (0, 0)) -> CoverageState:
        """Fold one drain interval in.

        Args:
            at: the drain's time, seconds (any monotonic origin).
            counted: L3 bytes the drain returned that the interfaces should have carried:
                every delta's on the veth hook, those with a peer off the node on the
                cgroup hook (:func:`off_node_bytes`).
            interfaces: ``{ifindex: counters}`` for the same interval
                (``Datapath.interface_bytes()``: the hooked veths, or the uplinks); empty
                after the first drain and whenever the devices could not be read, and
                then the interval is left out of the byte comparison.
            tcp: TCP packets the drain counted ``(into, out_of)`` local sockets or pods
                (:func:`tcp_packets`).

        Returns:
            the new state.
        """
        carried = carried_l3(interfaces.values()) if interfaces else None
        self._window.append((at, counted, carried, tcp[0], tcp[1]))
        while self._window and self._window[0][0] <= at - self.window_seconds:
            self._window.popleft()
        w_counted = sum(c for _, c, k, _, _ in self._window if k is not None)
        w_carried = sum(k for _, _, k, _, _ in self._window if k is not None)
        ratio = w_counted / w_carried if w_carried >= MIN_CARRIED_BYTES else math.nan
        into = sum(i for *_, i, _ in self._window)
        out = sum(o for *_, o in self._window)
        busier = max(into, out)
        direction = min(into, out) / busier if busier >= MIN_TCP_PACKETS else math.nan
        s = self._state
        if carried is not None:
            s = CoverageState(s.counted_bytes + counted, s.carried_bytes + carried,
                              s.unseen_bytes + max(0, carried - counted))
        self._state = CoverageState(s.counted_bytes, s.carried_bytes, s.unseen_bytes, ratio,
                                    ratio < STARVED_RATIO or direction < ONE_WAY_RATIO, direction)
        return self._state

    def state(self) -> CoverageState:
        """The latest :class:`CoverageState`."""
        return self._state

    def restore(self, counted: int, carried: int, unseen: int) -> None:
        """Continue the cumulative totals of a previous agent (its checkpoint), L3 bytes,
        so ``zonemeter_hook_*_total`` never go back across a restart. The window (and so
        the ratio) starts empty."""
        s = self._state
        self._state = CoverageState(counted, carried, unseen, s.ratio, s.starved)
