"""Drain the double-buffered kernel flow tables into :class:`agent.records.FlowDelta` records.

The programs in ``bpf/tc.c`` write to whichever of two identical hash maps
(``zm_flows_a``/``zm_flows_b``) the one-slot array-of-maps ``zm_active`` points at.
:meth:`FlowTables.drain`:

1. points ``zm_active`` at the other (empty) table, and ``zm_cache_active`` at the other
   (empty) per-CPU flow cache; both updates are issued at once from two threads, so
   they wait for one grace period, not two (:meth:`FlowTables._switch_both`). The kernel
   waits for every running BPF program before the ``bpf()`` update of an array-of-maps
   returns (``maybe_wait_bpf_programs``: ``synchronize_rcu``), so from then on nothing
   writes to the old table or the old cache; the old cache is then folded into the old
   table;
2. reads and deletes the old table with ``BPF_MAP_LOOKUP_AND_DELETE_BATCH`` (fallback
   when the kernel refuses batch operations: collect the keys with ``get_next_key``, then
   look up and delete them one by one; exact too, because the table is idle);
3. seeds the old table's overflow entries again so it is ready for the next swap.

With pinned maps (``DatapathConfig.pin_path``) a restarted agent builds
``FlowTables(..., reuse=True)``: it keeps whichever table the kernel is writing to, and
its first drain also empties the idle table, which holds what a previous agent killed
in the middle of a drain had not read yet.

Hence no increment can land between read and delete, and none is lost. Overflow
entries (one per kind and address family, pre-seeded so the kernel always finds them
when the table is full) come out as ``FlowDelta(overflow=True)``.

Which of these deltas a node keeps (the exactly-once rule) is decided in
:mod:`agent.attribution` (:func:`agent.attribution.counted_here`), never here.
"""

from __future__ import annotations

import ctypes as ct
import errno
import gc
import ipaddress
import threading
from dataclasses import dataclass
from typing import Any

from agent.datapath.abi import (
    CACHE_SLOTS,
    FAMILY_INET,
    FAMILY_INET6,
    FLOW_KEY_WIRE,
    FLOW_VALUE_WIRE,
    KIND_BY_VALUE,
    CacheSlot,
    FlowKey,
    FlowValue,
    ifindex_from_wire,
    overflow_key,
)
from agent.datapath.pins import call_errno, libbcc, map_info
from agent.errors import RuntimeFailure
from agent.records import FlowDelta, FlowKind, IPAddress

#: addresses :meth:`FlowTables._convert` keeps between drains (IPv4 and IPv6 together):
#: a drain that leaves more empties both caches. A node's pods and the peers they talk
#: to within one interval are usually far fewer; 16,384 addresses hold about 2.4 MiB
#: (the ``ipaddress`` object, its integer key and the dict entry: ~150 bytes each,
#: measured with tracemalloc).
ADDRESS_CACHE_MAX = 16384

_BPF_NOEXIST = 1
_BPF_EXIST = 2
_UNSPEC: dict[int, IPAddress] = {FAMILY_INET: ipaddress.IPv4Address(0),
                               FAMILY_INET6: ipaddress.IPv6Address(0)}


@dataclass(frozen=True, slots=True)
class TableStats:
    """Health of the flow tables, as of the last drain.

    Attributes:
        entries: flow entries (overflow entries excluded) the last drained table held.
        capacity: flow entries a table holds before bytes go to the overflow entries.
        overflow_bytes: L3 bytes counted in overflow entries since start.
        lost_bytes, lost_packets: bytes/packets that found no table at all since start
            (``zm_lost``); zero unless the agent failed to seed the overflow entries.
        drains: drains done so far.
        batch: True while the batch syscalls work, False once the fallback was needed.
    """

    entries: int
    capacity: int
    overflow_bytes: int
    lost_bytes: int
    lost_packets: int
    drains: int
    batch: bool


class FlowTables:
    """The double-buffered flow tables of one loaded program set.

    Built by :class:`agent.datapath.attach.Datapath` from the map file descriptors; other
    stages only see the :class:`FlowDelta` records :meth:`drain` returns.

    Args:
        table_fds: fds of ``zm_flows_a`` and ``zm_flows_b`` (same definition).
        active_fd: fd of the one-slot array-of-maps ``zm_active``.
        lost_fd: fd of the one-slot array ``zm_lost`` (cumulative, never reset).
        capacity: ``ZM_FLOW_CAPACITY``; each table has capacity + 8 slots.
        reuse: the maps were pinned by a previous agent and still count: keep the table
            the kernel writes to, and let the first drain also empty the idle one.
        caches: ``((zm_cache_a fd, zm_cache_b fd), zm_cache_active fd)``: the per-CPU flow
            caches in front of the tables (bpf/maps.h), or None for programs without.

    Raises:
        RuntimeFailure: the kernel refused to seed or switch the tables.
    """

    def __init__(self, table_fds: tuple[int, int], active_fd: int, lost_fd: int,
                 capacity: int, reuse: bool = False,
                 caches: tuple[tuple[int, int], int] | None = None) -> None:
        self._fds = table_fds
        self._active_fd = active_fd
        self._lost_fd = lost_fd
        self.capacity = capacity
        self._max = capacity + len(KIND_BY_VALUE) * 2
        self._active = 0
        self._lock = threading.Lock()
        self._batch = True
        self._entries = 0
        self._drains = 0
        self._overflow_bytes = 0
        # buffers reused across drains: a drain of 100,000 entries allocates nothing big
        self._keys = (FlowKey * self._max)()
        self._values = (FlowValue * self._max)()
        self._leftover = False
        # address objects shared by the records of this and later drains (see _convert)
        self._v4: dict[int, IPAddress] = {}
        self._v6: dict[int, IPAddress] = {}
        # ifindex as read by FLOW_KEY_WIRE -> ifindex (a node has a few hundred veths)
        self._ifindexes: dict[int, int] = {}
        for fd in self._fds:
            self._seed(fd)
        current = self._kernel_active(self._active_fd, self._fds) if reuse else None
        if current is None:
            self._point_active(0)
        else:
            self._active = current
            self._leftover = True
        self._caches = caches
        self._cache_active = 0
        self._cache_leftover = False
        if caches is not None:
            from bcc.utils import get_possible_cpus

            # a per-CPU array value is one CacheSlot per possible CPU
            self._cache_buf = (CacheSlot * len(get_possible_cpus()))()
            self._cache_zero = (CacheSlot * len(get_possible_cpus()))()
            cur = self._kernel_active(caches[1], caches[0]) if reuse else None
            if cur is None:
                self._point_cache(0)
            else:
                self._cache_active = cur
                self._cache_leftover = True

    @staticmethod
    def _kernel_active(outer_fd: int, fds: tuple[int, int]) -> int | None:
        """Index in fds of the map the one-slot array-of-maps outer_fd points at, or None
        when the slot is empty."""
        slot = ct.c_int(0)
        inner = ct.c_uint32(0)
        if libbcc().bpf_lookup_elem(outer_fd, ct.byref(slot), ct.byref(inner)) < 0:
            return None
        ids = [map_info(fd).id for fd in fds]
        return ids.index(inner.value) if inner.value in ids else None

    # -- kernel operations ------------------------------------------------------------

    def _seed(self, fd: int) -> None:
        """Insert the 8 zero overflow entries into table fd (existing ones are kept)."""
        zero = FlowValue()
        for kind in KIND_BY_VALUE:
            for family in (FAMILY_INET, FAMILY_INET6):
                key = overflow_key(kind, family)
                res = libbcc().bpf_update_elem(fd, ct.byref(key), ct.byref(zero), _BPF_NOEXIST)
                if res < 0 and call_errno(res) != errno.EEXIST:
                    raise RuntimeFailure(
                        f"cannot seed overflow entry in flow table: {errno.errorcode.get(call_errno(res))}")

    def _point_active(self, index: int) -> None:
        """Point zm_active at table index; returns once no program uses the old one."""
        slot = ct.c_int(0)
        fd = ct.c_int(self._fds[index])
        res = libbcc().bpf_update_elem(self._active_fd, ct.byref(slot), ct.byref(fd), 0)
        if res < 0:
            raise RuntimeFailure(
                f"cannot switch the active flow table: {errno.errorcode.get(call_errno(res))}")
        self._active = index

    def _point_cache(self, index: int) -> None:
        """Point zm_cache_active at cache index; returns once no program uses the old one."""
        assert self._caches is not None
        slot = ct.c_int(0)
        fd = ct.c_int(self._caches[0][index])
        res = libbcc().bpf_update_elem(self._caches[1], ct.byref(slot), ct.byref(fd), 0)
        if res < 0:
            raise RuntimeFailure(
                f"cannot switch the active flow cache: {errno.errorcode.get(call_errno(res))}")
        self._cache_active = index

    def _switch_both(self) -> None:
        """Point zm_cache_active at the other cache and zm_active at the other table, the
        two ``bpf()`` updates issued at the same time from two threads.

        Each update returns after ``synchronize_rcu()``; issued together they wait for the
        same grace period instead of one after the other (about 12 ms less per drain,
        BENCHMARKS.md; ctypes releases the GIL during the calls). The order of the two
        switches does not matter for exactness: a count lands in the old or the new cache
        and is flushed from there into the old or the new table; once both calls have
        returned no program holds the old cache or the old table, and the old cache is
        folded into the old table before it is read. Every count is thus read exactly
        once, by this drain or the next one.

        Raises:
            RuntimeFailure: the kernel refused a switch. If only the cache switch failed,
                the table did switch: its old table is kept for the next drain (as after
                a restart), so nothing is lost; a cache left unfolded keeps its counts,
                which reach a table when the cache is active again.
        """
        failed: list[RuntimeFailure] = []

        def switch_cache() -> None:
            try:
                self._point_cache(1 - self._cache_active)
            except RuntimeFailure as err:
                failed.append(err)

        worker = threading.Thread(target=switch_cache, name="zm-cache-switch", daemon=True)
        try:
            worker.start()
            started = True
        except RuntimeError:  # no thread to be had: one switch after the other
            switch_cache()
            started = False
        try:
            self._point_active(1 - self._active)
        finally:
            if started:
                worker.join()
        if failed:
            self._leftover = True  # the table switched: drain the old one next time
            raise failed[0]

    def _fold(self, cache_fd: int, table_fd: int) -> None:
        """Move every slot of the idle per-CPU cache cache_fd into the idle table table_fd
        (added to the flow's entry, or a new entry, or when the table is full the
        overflow entry of the flow's (kind, family)), and empty the slots.

        Raises:
            RuntimeFailure: the kernel refused a read or write.
        """
        lib = libbcc()
        buf, zero = self._cache_buf, self._cache_zero
        idx = ct.c_int(0)
        value = FlowValue()
        for i in range(CACHE_SLOTS):
            idx.value = i
            if lib.bpf_lookup_elem(cache_fd, ct.byref(idx), ct.byref(buf)) < 0:
                raise RuntimeFailure(f"cannot read flow cache slot {i}: "
                                     f"{errno.errorcode.get(ct.get_errno())}")
            used = False
            for cpu_slot in buf:
                if not cpu_slot.packets:
                    continue
                used = True
                key = cpu_slot.key
                if lib.bpf_lookup_elem(table_fd, ct.byref(key), ct.byref(value)) == 0:
                    value.bytes += cpu_slot.bytes
                    value.packets += cpu_slot.packets
                    res = lib.bpf_update_elem(table_fd, ct.byref(key), ct.byref(value), _BPF_EXIST)
                else:
                    value.bytes, value.packets = cpu_slot.bytes, cpu_slot.packets
                    res = lib.bpf_update_elem(table_fd, ct.byref(key), ct.byref(value), _BPF_NOEXIST)
                    if res < 0 and call_errno(res) == errno.E2BIG:  # full: the overflow entry
                        okey = overflow_key(KIND_BY_VALUE[key.kind], key.family)
                        if lib.bpf_lookup_elem(table_fd, ct.byref(okey), ct.byref(value)) < 0:
                            raise RuntimeFailure("flow table full and its overflow entry missing")
                        value.bytes += cpu_slot.bytes
                        value.packets += cpu_slot.packets
                        res = lib.bpf_update_elem(table_fd, ct.byref(okey), ct.byref(value),
                                                  _BPF_EXIST)
                if res < 0:
                    raise RuntimeFailure(f"cannot fold the flow cache into the table: "
                                         f"{errno.errorcode.get(call_errno(res))}")
            if used:
                res = lib.bpf_update_elem(cache_fd, ct.byref(idx), ct.byref(zero), 0)
                if res < 0:
                    raise RuntimeFailure(f"cannot empty flow cache slot {i}: "
                                         f"{errno.errorcode.get(call_errno(res))}")

    def _take_batch(self, fd: int) -> int:
        """Lookup-and-delete every entry of fd into the buffers; returns the count.

        Raises:
            OSError: the kernel refused the batch operation (caller falls back).
        """
        lib = libbcc()
        total = 0
        token = ct.c_uint32(0)
        count = ct.c_uint32(0)
        first = True
        key_size, value_size = ct.sizeof(FlowKey), ct.sizeof(FlowValue)
        while total < self._max:
            count.value = self._max - total
            res = lib.bpf_lookup_and_delete_batch(
                fd, None if first else ct.byref(token), ct.byref(token),
                ct.byref(self._keys, key_size * total),
                ct.byref(self._values, value_size * total), ct.byref(count))
            first = False
            total += count.value
            if res < 0:
                code = call_errno(res)
                if code == errno.ENOENT:  # table exhausted: done
                    break
                raise OSError(code, f"BPF_MAP_LOOKUP_AND_DELETE_BATCH: {errno.errorcode.get(code)}")
            if count.value == 0:
                break
        return total

    def _take_one_by_one(self, fd: int) -> int:
        """Fallback of :meth:`_take_batch`: keys first, then lookup + delete each."""
        lib = libbcc()
        keys: list[FlowKey] = []
        cur = FlowKey()
        nxt = FlowKey()
        res = lib.bpf_get_next_key(fd, None, ct.byref(nxt))
        while res == 0 and len(keys) < self._max:
            keys.append(FlowKey.from_buffer_copy(nxt))
            ct.memmove(ct.byref(cur), ct.byref(nxt), ct.sizeof(FlowKey))
            res = lib.bpf_get_next_key(fd, ct.byref(cur), ct.byref(nxt))
        total = 0
        for key in keys:
            value = FlowValue()
            if lib.bpf_lookup_elem(fd, ct.byref(key), ct.byref(value)) < 0:
                continue
            lib.bpf_delete_elem(fd, ct.byref(key))
            self._keys[total] = key
            self._values[total] = value
            total += 1
        return total

    # -- public -----------------------------------------------------------------------

    def drain(self) -> list[FlowDelta]:
        """Return the bytes and packets counted since the previous drain, and reset them.

        Returns:
            one :class:`FlowDelta` per flow key with a non-zero count, plus one
            ``overflow=True`` delta per (kind, family) whose overflow entry is non-zero.
            Bytes are L3 bytes on the wire (docs/datapath.md); ports host order.

        Raises:
            RuntimeFailure: the kernel refused to switch tables.
        """
        with self._lock:
            deltas: list[FlowDelta] = []
            old = self._active
            fold: list[int] = []
            if self._leftover:  # idle since a previous agent's swap: nothing writes to it
                self._leftover = False
                deltas = self._take_and_convert(self._fds[1 - old])
            if self._caches is not None:
                if self._cache_leftover:  # idle since a previous agent's swap, like the table
                    self._cache_leftover = False
                    fold.append(1 - self._cache_active)
                fold.append(self._cache_active)
                self._switch_both()
            else:
                self._point_active(1 - old)
            for index in fold:  # nothing writes to these any more
                assert self._caches is not None
                self._fold(self._caches[0][index], self._fds[old])
            deltas += self._take_and_convert(self._fds[old])
            self._drains += 1
            return deltas

    def _take_and_convert(self, fd: int) -> list[FlowDelta]:
        """Empty the idle table fd into records; seed its overflow entries again."""
        n = 0
        if self._batch:
            try:
                n = self._take_batch(fd)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP,
                                     errno.ENOSYS, errno.EPERM):
                    raise RuntimeFailure(f"cannot drain flow table: {err}") from err
                self._batch = False
        if not self._batch:
            n = self._take_one_by_one(fd)
        self._seed(fd)
        return self._convert(n)

    def _convert(self, n: int) -> list[FlowDelta]:
        """Turn the first n buffered entries into records.

        The hot loop of a drain (100,000 entries in BENCHMARKS.md):

        * addresses are built from integers once and kept across drains in
          ``self._v4``/``self._v6`` (keyed by the key's low 64 bits for IPv4, the whole
          128 bits for IPv6): flows share pods, and a node's pods and peers stay from one
          interval to the next. Both dicts are emptied after a drain that leaves them
          above :data:`ADDRESS_CACHE_MAX` addresses, so they stay bounded;
        * records are built as :class:`_Unfrozen` objects (same slots as FlowDelta, plain
          attribute stores, which the interpreter specialises to a direct slot write) and
          then given their class FlowDelta: half the cost of calling the eight slot
          descriptors (what :func:`_fast_delta` does), a third of the constructor's;
        * the cyclic garbage collector is paused meanwhile, since none of these objects
          can form a cycle and 100,000 new objects would otherwise trigger about 140
          collections.
        """
        keys = memoryview(self._keys).cast("B")[: n * FLOW_KEY_WIRE.size]
        values = memoryview(self._values).cast("B")[: n * FLOW_VALUE_WIRE.size]
        v4cache = self._v4
        v6cache = self._v6
        v4 = ipaddress.IPv4Address
        v6 = ipaddress.IPv6Address
        kinds = KIND_BY_VALUE
        fd, unfrozen = FlowDelta, _Unfrozen
        ifindexes = self._ifindexes
        out: list[FlowDelta] = []
        overflows = 0
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            for (lhi, llo, rhi, rlo, port, local_port, proto, kind, family, overflow, rawif), (
                    nbytes, npackets) in zip(
                    FLOW_KEY_WIRE.iter_unpack(keys), FLOW_VALUE_WIRE.iter_unpack(values), strict=True):
                if overflow:
                    overflows += 1
                    self._overflow_bytes += nbytes
                    if nbytes or npackets:
                        out.append(FlowDelta(kinds[kind], _UNSPEC[family], _UNSPEC[family],
                                             0, 0, nbytes, npackets, True))
                    continue
                if not npackets:
                    continue
                if family == FAMILY_INET:  # ::ffff:a.b.c.d: the address is the low 32 bits
                    la = v4cache.get(llo)
                    if la is None:
                        la = v4cache[llo] = v4(llo & 0xFFFFFFFF)
                    ra = v4cache.get(rlo)
                    if ra is None:
                        ra = v4cache[rlo] = v4(rlo & 0xFFFFFFFF)
                else:
                    lint = (lhi << 64) | llo
                    la = v6cache.get(lint)
                    if la is None:
                        la = v6cache[lint] = v6(lint)
                    rint = (rhi << 64) | rlo
                    ra = v6cache.get(rint)
                    if ra is None:
                        ra = v6cache[rint] = v6(rint)
                d: Any = unfrozen()  # slots typed through FlowDelta; see _Unfrozen
                d.kind = kinds[kind]
                d.local = la
                d.remote = ra
                d.port = port
                d.local_port = local_port
                ifindex = ifindexes.get(rawif)
                if ifindex is None:
                    ifindex = ifindexes[rawif] = ifindex_from_wire(rawif)
                d.ifindex = ifindex
                d.protocol = proto
                d.bytes = nbytes
                d.packets = npackets
                d.overflow = False
                d.__class__ = fd  # now a FlowDelta (frozen from here on)
                out.append(d)  # the specialised list append (faster than a bound method)
        finally:
            if paused:
                gc.enable()
            if len(v4cache) + len(v6cache) > ADDRESS_CACHE_MAX:
                v4cache.clear()
                v6cache.clear()
            if len(ifindexes) > ADDRESS_CACHE_MAX:
                ifindexes.clear()
        self._entries = n - overflows
        return out

    def lost(self) -> tuple[int, int]:
        """Return cumulative (bytes, packets) that found no table (``zm_lost``)."""
        slot = ct.c_int(0)
        value = FlowValue()
        if libbcc().bpf_lookup_elem(self._lost_fd, ct.byref(slot), ct.byref(value)) < 0:
            return (0, 0)
        return (value.bytes, value.packets)

    def stats(self) -> TableStats:
        """Return :class:`TableStats` as of the last drain."""
        lost_bytes, lost_packets = self.lost()
        return TableStats(self._entries, self.capacity, self._overflow_bytes, lost_bytes,
                          lost_packets, self._drains, self._batch)


_NEW = object.__new__


class _Unfrozen:
    """FlowDelta's slots, without its frozen ``__setattr__``: :meth:`FlowTables._convert`
    fills one with attribute stores and then assigns ``__class__ = FlowDelta``. Python
    allows that assignment only between classes with the same base and the same slots
    (otherwise TypeError, which tests/unit/datapath/test_drain.py would show), and the object is
    then a FlowDelta like any other (equality, hash, immutability)."""

    __slots__ = FlowDelta.__slots__


(_SET_KIND, _SET_LOCAL, _SET_REMOTE, _SET_PORT, _SET_PROTOCOL, _SET_BYTES, _SET_PACKETS,
 _SET_OVERFLOW, _SET_LOCAL_PORT, _SET_IFINDEX) = (getattr(FlowDelta, f).__set__ for f in (
    "kind", "local", "remote", "port", "protocol", "bytes", "packets", "overflow",
    "local_port", "ifindex"))


def _fast_delta(kind: FlowKind, local: IPAddress, remote: IPAddress, port: int,
                protocol: int, nbytes: int, packets: int) -> FlowDelta:
    """Return ``FlowDelta(kind, local, remote, port, protocol, nbytes, packets)``.

    Equal to the constructor's result (tests/unit/datapath/test_drain.py checks it) but about
    twice as fast: the frozen dataclass ``__init__`` goes through ``object.__setattr__``
    per field, this sets the slots directly. FlowDelta has no validation to skip.
    """
    d = _NEW(FlowDelta)
    _SET_KIND(d, kind)
    _SET_LOCAL(d, local)
    _SET_REMOTE(d, remote)
    _SET_PORT(d, port)
    _SET_PROTOCOL(d, protocol)
    _SET_BYTES(d, nbytes)
    _SET_PACKETS(d, packets)
    _SET_OVERFLOW(d, False)
    _SET_LOCAL_PORT(d, 0)
    _SET_IFINDEX(d, 0)
    return d
