"""Drain the double-buffered kernel flow tables into :class:`agent.records.FlowDelta` records.

The programs in ``bpf/tc.c`` write to whichever of two identical hash maps
(``zm_flows_a``/``zm_flows_b``) the one-slot array-of-maps ``zm_active`` points at, through
the per-CPU flow cache ``zm_cache_active`` points at. Table i and cache i form side i.
:meth:`FlowTables.drain`:

1. points ``zm_active`` at the other (empty) table, and ``zm_cache_active`` at the other
   (empty) per-CPU flow cache; both updates are issued at once from two threads, so
   they wait for one grace period, not two (:meth:`FlowTables._switch_both`). The kernel
   waits for every running BPF program before the ``bpf()`` update of an array-of-maps
   returns (``maybe_wait_bpf_programs``: ``synchronize_rcu``), so from then on nothing
   writes to the old side;
2. reads the old table (``BPF_MAP_LOOKUP_BATCH``; fallback when the kernel refuses batch
   operations: ``get_next_key`` then one lookup per key) and the old cache's used slots,
   **without deleting anything**;
3. :meth:`FlowTables.commit` empties the old side (``BPF_MAP_DELETE_BATCH``, overflow
   entries seeded again, cache slots zeroed) and then bumps the side's generation in the
   pinned marker map ``zm_epoch``. Without ``hold`` this follows the read at once; a
   checkpointing agent (:mod:`agent.checkpoint`) calls it only once the totals that
   include the side are on disk, so a crash at any point neither loses nor doubles a
   byte (docs/datapath.md, "Exactly once across a crash").

With pinned maps (``DatapathConfig.pin_path``) a restarted agent builds
``FlowTables(..., reuse=True)``: it keeps whichever side the kernel is writing to, and
its first drain looks at the idle side: when the checkpoint's :class:`HandOver` says that
side's generation is in its totals already, it is only emptied; otherwise it is counted.

Overflow entries (one per kind and address family, pre-seeded so the kernel always finds
them when the table is full) come out as ``FlowDelta(overflow=True)``.

Which of these deltas a node keeps (the exactly-once rule) is decided in
:mod:`agent.attribution` (:func:`agent.attribution.counted_here`), never here.
"""

from __future__ import annotations

import ctypes as ct
import errno
import gc
import ipaddress
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from agent.datapath.abi import (
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


@dataclass(frozen=True, slots=True)
class HandOver:
    """The kernel half of a checkpoint: which table contents the agent's totals include.

    Written into the checkpoint file with the totals (:mod:`agent.checkpoint`) and given
    back to :meth:`FlowTables.resume` by the next agent (docs/datapath.md, "Exactly once
    across a crash").

    Attributes:
        pins_id: ``zm_epoch[0]``, a random non-zero id of this set of maps (maps created
            anew, after a reboot or a layout change, get another id, and the folded
            generations below no longer apply to them).
        folded: per table (``zm_flows_a``, ``zm_flows_b``, each with its flow cache): the
            generation (``zm_epoch[1 + i]``) whose contents the totals include; 0: none.
    """

    pins_id: int
    folded: tuple[int, int]


def _crash_point(name: str) -> None:
    """Test hook (lazy import: the datapath does not depend on the agent's checkpoint)."""
    from agent.checkpoint import crash_point

    crash_point(name)


class FlowTables:
    """The double-buffered flow tables of one loaded program set.

    Built by :class:`agent.datapath.attach.Datapath` from the map file descriptors; other
    stages only see the :class:`FlowDelta` records :meth:`drain` returns.

    A "side" i is flow table i with flow cache i; the side the kernel writes to is
    active, the other idle (frozen: nothing writes to it). A drain reads an idle side
    **without deleting**; the side is emptied by :meth:`commit` (at once when ``hold`` is
    False, else once the caller made the totals that include it durable) and its
    generation in ``zm_epoch`` is then bumped. A side is only made active again after it
    was emptied and bumped.

    Args:
        table_fds: fds of ``zm_flows_a`` and ``zm_flows_b`` (same definition).
        active_fd: fd of the one-slot array-of-maps ``zm_active``.
        lost_fd: fd of the one-slot array ``zm_lost`` (cumulative, never reset).
        capacity: ``ZM_FLOW_CAPACITY``; each table has capacity + 8 slots.
        reuse: the maps were pinned by a previous agent and still count: keep the table
            the kernel writes to, and let the first drain look at the idle side too.
        caches: ``((zm_cache_a fd, zm_cache_b fd), zm_cache_active fd)``: the per-CPU flow
            caches in front of the tables (bpf/maps.h), or None for programs without.
        epoch_fd: fd of the ``zm_epoch`` marker array (None: no marker, pins id 0).
        hold: keep a drained side until :meth:`commit` (a checkpointing agent).

    Raises:
        RuntimeFailure: the kernel refused to seed or switch the tables.
    """

    def __init__(self, table_fds: tuple[int, int], active_fd: int, lost_fd: int,
                 capacity: int, reuse: bool = False,
                 caches: tuple[tuple[int, int], int] | None = None,
                 epoch_fd: int | None = None, hold: bool = False) -> None:
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
        self.hold = hold
        self._epoch_fd = epoch_fd
        self._pending: int | None = None  # idle side read, not emptied yet
        # (side, its table's entries) whose keys the buffers still hold from the read
        self._buffered: tuple[int, int] | None = None
        self._folded = [0, 0]
        self._leftover = False  # the next drain first looks at the idle side
        self._caches = caches
        self._cache_active = 0
        if caches is not None:
            from bcc.utils import get_possible_cpus

            # slots per CPU as the programs were built (ZM_CACHE_SLOTS; bench variants
            # build others), read from the map itself
            self._cache_slots = map_info(caches[0][0]).max_entries
            # a per-CPU array value is one CacheSlot per possible CPU
            self._cache_buf = (CacheSlot * len(get_possible_cpus()))()
            self._cache_zero = (CacheSlot * len(get_possible_cpus()))()
        # buffers reused across drains: a drain of 100,000 entries allocates nothing big
        self._keys = (FlowKey * self._max)()
        self._values = (FlowValue * self._max)()
        # address objects shared by the records of this and later drains (see _convert)
        self._v4: dict[int, IPAddress] = {}
        self._v6: dict[int, IPAddress] = {}
        # ifindex as read by FLOW_KEY_WIRE -> ifindex (a node has a few hundred veths)
        self._ifindexes: dict[int, int] = {}
        for fd in self._fds:
            self._seed(fd)
        self.pins_id = 0
        if epoch_fd is not None:
            self.pins_id = self._epoch(0) if reuse else 0
            if not self.pins_id:  # new maps: a new id, both sides at generation 1
                for i in (1, 2):
                    self._set_epoch(i, 1)
                self.pins_id = secrets.randbits(63) | 1
                self._set_epoch(0, self.pins_id)
        current = self._kernel_active(self._active_fd, self._fds) if reuse else None
        if current is None:
            self._point_active(0)
        else:
            self._active = current
            self._leftover = True
        if caches is not None:
            cur = self._kernel_active(caches[1], caches[0]) if reuse else None
            if cur is None or cur != self._active:
                # none yet, or a previous agent died between its two switches: finish the
                # switch (cache on the table's side); either way each side's counts stay
                # in that side's cache or in some table, to be read with that side
                self._point_cache(self._active)
            else:
                self._cache_active = cur

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

    def _epoch(self, index: int) -> int:
        """``zm_epoch[index]`` (0 without the marker map)."""
        if self._epoch_fd is None:
            return 0
        slot, value = ct.c_int(index), ct.c_uint64(0)
        if libbcc().bpf_lookup_elem(self._epoch_fd, ct.byref(slot), ct.byref(value)) < 0:
            raise RuntimeFailure(f"cannot read zm_epoch[{index}]: "
                                 f"{errno.errorcode.get(ct.get_errno())}")
        return int(value.value)

    def _set_epoch(self, index: int, value: int) -> None:
        """Write ``zm_epoch[index]`` (no-op without the marker map)."""
        if self._epoch_fd is None:
            return
        slot, val = ct.c_int(index), ct.c_uint64(value)
        res = libbcc().bpf_update_elem(self._epoch_fd, ct.byref(slot), ct.byref(val), 0)
        if res < 0:
            raise RuntimeFailure(f"cannot write zm_epoch[{index}]: "
                                 f"{errno.errorcode.get(call_errno(res))}")

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
        read with the old table. Every count is thus read exactly once, by this drain or
        the next one.

        Raises:
            RuntimeFailure: the kernel refused a switch. If only the cache switch failed,
                the table did switch: the next drain points the cache at the table's side
                and reads the old side first (as after a restart), so nothing is lost.
        """
        failed: list[RuntimeFailure] = []

        def switch_cache() -> None:
            try:
                self._point_cache(1 - self._cache_active)
            except RuntimeFailure as err:
                failed.append(err)
            else:
                _crash_point("mid_switch")  # the table's switch may or may not be done

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
            self._leftover = True  # the table switched: read the old side next time
            raise failed[0]

    def _read_cache(self, cache_fd: int) -> tuple[list[tuple[bytes, int, int]], list[int]]:
        """Read every used slot of the idle per-CPU cache cache_fd; nothing is changed.

        Returns:
            ``([(flow key bytes, bytes, packets)] one per CPU whose slot holds counts,
            indexes of the used slots)``.

        Raises:
            RuntimeFailure: the kernel refused a read.
        """
        lib = libbcc()
        buf = self._cache_buf
        idx = ct.c_int(0)
        used: list[int] = []
        out: list[tuple[bytes, int, int]] = []
        for i in range(self._cache_slots):
            idx.value = i
            if lib.bpf_lookup_elem(cache_fd, ct.byref(idx), ct.byref(buf)) < 0:
                raise RuntimeFailure(f"cannot read flow cache slot {i}: "
                                     f"{errno.errorcode.get(ct.get_errno())}")
            hit = False
            for cpu_slot in buf:
                if not cpu_slot.packets:
                    continue
                hit = True
                out.append((bytes(cpu_slot.key), cpu_slot.bytes, cpu_slot.packets))
            if hit:
                used.append(i)
        return out, used

    def _merge_cache(self, n: int, slots: list[tuple[bytes, int, int]]) -> int:
        """Add the cache counts ``slots`` to the n table entries in the buffers, as the
        kernel would have had they been flushed into the table: into the flow's entry;
        else a new entry while the table holds fewer than ``capacity`` flows; else the
        overflow entry of the flow's (kind, family). Only the buffers change (the idle
        side in the kernel is emptied by :meth:`commit`), so a drain returns at most
        ``capacity + 8`` records. Returns the entries in the buffers now."""
        if not slots:
            return n
        size = ct.sizeof(FlowKey)
        raw = memoryview(self._keys).cast("B")
        index = {bytes(raw[i * size:(i + 1) * size]): i for i in range(n)}
        kind_at, family_at, overflow_at = (FlowKey.kind.offset, FlowKey.family.offset,
                                           FlowKey.overflow.offset)
        flows = n - sum(1 for k in index if k[overflow_at])
        values = self._values
        for key, nbytes, npackets in slots:
            at = index.get(key)
            if at is None:
                if flows < self.capacity:
                    at = index[key] = n
                    ct.memmove(ct.byref(self._keys, at * size), key, size)
                    values[at].bytes = values[at].packets = 0
                    n += 1
                    flows += 1
                else:
                    okey = bytes(overflow_key(KIND_BY_VALUE[key[kind_at]], key[family_at]))
                    at = index.get(okey)
                    if at is None:
                        raise RuntimeFailure("flow table full and its overflow entry missing")
            values[at].bytes += nbytes
            values[at].packets += npackets
        return n

    def _take_batch(self, fd: int) -> int:
        """Copy every entry of fd into the buffers (``BPF_MAP_LOOKUP_BATCH``; nothing is
        deleted); returns the count.

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
            res = lib.bpf_lookup_batch(
                fd, None if first else ct.byref(token), ct.byref(token),
                ct.byref(self._keys, key_size * total),
                ct.byref(self._values, value_size * total), ct.byref(count))
            first = False
            total += count.value
            if res < 0:
                code = call_errno(res)
                if code == errno.ENOENT:  # table exhausted: done
                    break
                raise OSError(code, f"BPF_MAP_LOOKUP_BATCH: {errno.errorcode.get(code)}")
            if count.value == 0:
                break
        return total

    def _take_one_by_one(self, fd: int) -> int:
        """Fallback of :meth:`_take_batch`: keys first, then look each up (no delete)."""
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
            self._keys[total] = key
            self._values[total] = value
            total += 1
        return total

    def _read_table(self, fd: int) -> int:
        """Copy every entry of the idle table fd into the buffers; returns the count.

        Raises:
            RuntimeFailure: the kernel refused to read the table.
        """
        if self._batch:
            try:
                return self._take_batch(fd)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP,
                                     errno.ENOSYS, errno.EPERM):
                    raise RuntimeFailure(f"cannot drain flow table: {err}") from err
                self._batch = False
        return self._take_one_by_one(fd)

    def _delete(self, fd: int, start: int, stop: int) -> None:
        """Delete the buffered keys [start, stop) from table fd (batch, else one by one;
        a key already gone is no error: a clear can be repeated)."""
        lib = libbcc()
        if stop <= start:
            return
        if self._batch:
            count = ct.c_uint32(stop - start)
            res = lib.bpf_delete_batch(fd, ct.byref(self._keys, ct.sizeof(FlowKey) * start),
                                       ct.byref(count))
            if res >= 0:
                return
            start += count.value  # the kernel stops at the first key it cannot delete
        for i in range(start, stop):
            lib.bpf_delete_elem(fd, ct.byref(self._keys[i]))

    def _read_side(self, side: int) -> list[FlowDelta]:
        """Records of everything idle side ``side`` holds (table and cache); unchanged."""
        n = self._read_table(self._fds[side])
        self._buffered = (side, n)  # merged cache entries only come after these n keys
        if self._caches is not None:
            n = self._merge_cache(n, self._read_cache(self._caches[0][side])[0])
        return self._convert(n)

    def _clear_side(self, side: int) -> None:
        """Empty idle side ``side`` (table entries deleted, overflow entries seeded
        again at zero, cache slots zeroed), then bump its generation in ``zm_epoch``.

        Idempotent up to the bump: a crash anywhere before it leaves the generation that
        the checkpoint records as folded, so the next agent empties the side again.

        Raises:
            RuntimeFailure: the kernel refused a read or write.
        """
        fd = self._fds[side]
        buffered, self._buffered = self._buffered, None
        # the keys of the read are still in the buffers (the side is idle: unchanged);
        # else (a side another agent read) list them again
        n = buffered[1] if buffered is not None and buffered[0] == side else self._read_table(fd)
        half = n // 2
        self._delete(fd, 0, half)
        _crash_point("mid_clear")
        self._delete(fd, half, n)
        self._seed(fd)
        if self._caches is not None:
            cache_fd = self._caches[0][side]
            _, used = self._read_cache(cache_fd)
            idx = ct.c_int(0)
            for i in used:
                idx.value = i
                res = libbcc().bpf_update_elem(cache_fd, ct.byref(idx), ct.byref(self._cache_zero), 0)
                if res < 0:
                    raise RuntimeFailure(f"cannot empty flow cache slot {i}: "
                                         f"{errno.errorcode.get(call_errno(res))}")
        _crash_point("after_clear")
        self._set_epoch(1 + side, self._epoch(1 + side) + 1)

    # -- public -----------------------------------------------------------------------

    def resume(self, handover: HandOver | None) -> None:
        """Take the previous agent's checkpointed :class:`HandOver`: an idle side whose
        generation it records as folded is only emptied by the first drain, not counted.
        A hand-over of other maps (another ``pins_id``) or None is ignored: the idle side
        is counted."""
        with self._lock:
            if handover is not None and handover.pins_id == self.pins_id and self.pins_id:
                self._folded = list(handover.folded)

    def handover(self) -> HandOver:
        """The :class:`HandOver` to checkpoint with totals that include every drain so far."""
        with self._lock:
            return HandOver(self.pins_id, (self._folded[0], self._folded[1]))

    def commit(self) -> bool:
        """Empty the side the last drain read (the caller's totals that include it are
        durable now). Returns False when nothing was pending.

        Raises:
            RuntimeFailure: the kernel refused; the side stays pending (retried next time).
        """
        with self._lock:
            return self._commit()

    def _commit(self) -> bool:
        side = self._pending
        if side is None:
            return False
        self._clear_side(side)
        self._pending = None
        return True

    def drain(self) -> list[FlowDelta]:
        """Return the bytes and packets counted since the previous drain.

        With ``hold`` the side read stays as it is until :meth:`commit`, and a drain
        while it is still pending returns ``[]`` without switching (the kernel goes on
        counting into the active side). The first drain after a restart looks at the
        idle side: folded already (:meth:`resume`): it is emptied and the drain goes on;
        else its contents are returned (with ``hold``, alone: the active side follows at
        the next drain).

        Returns:
            one :class:`FlowDelta` per flow key with a non-zero count, plus one
            ``overflow=True`` delta per (kind, family) whose overflow entry is non-zero.
            Bytes are L3 bytes on the wire (docs/datapath.md); ports host order.

        Raises:
            RuntimeFailure: the kernel refused to switch, read or empty tables.
        """
        with self._lock:
            if self._pending is not None:
                if self.hold:
                    return []
                self._commit()
            deltas: list[FlowDelta] = []
            if self._caches is not None and self._cache_active != self._active:
                self._point_cache(self._active)  # after a failed switch: sides in line again
            if self._leftover:  # idle since a previous agent's (or a failed) switch
                self._leftover = False
                side = 1 - self._active
                gen = self._epoch(1 + side)
                if gen and self._folded[side] == gen:
                    self._clear_side(side)  # in the checkpoint already: empty it only
                else:
                    deltas = self._read_side(side)
                    self._folded[side] = gen
                    self._pending = side
                    if self.hold:
                        self._drains += 1
                        return deltas
                    self._commit()
            old = self._active
            if self._caches is not None:
                self._switch_both()
            else:
                self._point_active(1 - old)
            _crash_point("after_switch")
            deltas += self._read_side(old)
            self._folded[old] = self._epoch(1 + old)
            self._pending = old
            if not self.hold:
                self._commit()
            self._drains += 1
            return deltas

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
