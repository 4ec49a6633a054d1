"""Pods by name and by address, with each address's tenures, so bytes go to the pod that held the IP then.

IP reuse: each IP keeps its tenures ``(pod, first_seen, deleted_at)``; deleted tenures stay
in a bounded :class:`cachetools.TTLCache` for the grace period so bytes counted just before
a pod went away (or just before its IP went to a new pod) still go to the pod that owned
the IP at that time. ``first_seen`` is when the cache learnt of the assignment (watch
latency is the error bar). Pods in phase Succeeded or Failed release their IPs (the
kubelet and CNI reuse them) even though the object remains. See docs/metadata.md.

Not thread-safe by itself: :class:`agent.k8s.cache.ClusterMetadata` calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cachetools import TTLCache

from agent.k8s.parse import PodRecord
from agent.records import IPAddress, Peer

_V6_TAG = 1 << 128


def tagged_address_key(ip: IPAddress) -> int:
    """Index key of an address: its integer, IPv6 tagged with bit 128 so it never collides with IPv4.

    Indexes are keyed by int, not by the address object: ``ipaddress`` hashes through
    ``hex()``, which made lookups several times slower, and an int key shares the address
    object's own integer instead of holding a second object. The key is non-negative, so
    :func:`agent.k8s.services.endpoint_key` can shift it left to pack port and protocol below it. (Attribution keys
    its own per-drain caches differently, IPv6 as the complement; the two keys never meet.)
    """
    n = int(ip)
    return n if ip.version == 4 else n | _V6_TAG


@dataclass(frozen=True, slots=True)
class Tenure:
    """One pod's hold on one IP.

    Attributes:
        pod: the pod.
        first_seen: when the cache learnt of it (seconds since the epoch, cache clock).
        deleted_at: when the pod (or its hold on the IP) went away, or None if current.
    """

    pod: PodRecord
    first_seen: float
    deleted_at: float | None


#: seconds after the end of the tenure a veth is bound to beyond which bytes counted
#: under that veth's ifindex are taken to be a new veth's: a CNI that creates the host
#: side of a veth in the pod's namespace and then moves it (AWS VPC CNI) lets it keep
#: the index it had there when that index is free on the host, e.g. the deleted pod's.
#: The old pod's own late bytes are drained within 0.25 s of the watch reporting its end
#: (docs/reliability.md), far inside this.
VETH_REUSE_SECONDS = 10.0


def _tenure(rec: PodRecord) -> tuple[str, str, float]:
    """Identity of a pod's hold on its addresses: a pod recreated under its name is a new one."""
    return (rec.namespace, rec.name, rec.since)


class PodTable:
    """The cache's pods: by namespace and name, live holders by address, finished tenures.

    Args:
        grace_seconds: how long a finished tenure stays resolvable.
        max_deleted: bound on remembered addresses with finished tenures.
        clock: seconds since the epoch (the cache's clock).
        memo: the cache's ``resolve()`` memo, keyed by :func:`tagged_address_key`; entries of
            addresses whose holder changes are dropped here.

    Attributes:
        by_name: namespace -> name -> record (no ``(namespace, name)`` tuple per pod).
        count: number of pods.
        live_by_ip: address key -> the live (non-host-network) pod holding it.
        deleted: address key -> its newest finished tenures (at most 4), for the grace.
        hostnet_by_ip: address key -> node of a host-network pod using it.
        hostnet_gen: bumped whenever the host-network address set changes.
        host_ports: ``(node, port, protocol number)`` -> ``{(namespace, name): record}`` of
            the live pods on that node serving that port of its address (host-network pods'
            declared ports, other pods' ``hostPort``: ``PodRecord.host_ports``), for
            :meth:`host_port_owner`.
        released: bumped whenever a pod's tenure of an address ends.
        veths: address key -> the host veths its bytes were counted on and the tenure
            each is bound to (:meth:`veth_owner`).
    """

    def __init__(self, grace_seconds: float, max_deleted: int, clock: Callable[[], float],
                 memo: dict[int, Peer]) -> None:
        self._clock = clock
        self._memo = memo
        self.by_name: dict[str, dict[str, PodRecord]] = {}
        self.count = 0
        self.live_by_ip: dict[int, PodRecord] = {}
        self.deleted: TTLCache[int, tuple[Tenure, ...]] = TTLCache(
            maxsize=max_deleted, ttl=grace_seconds, timer=clock)
        self.hostnet_by_ip: dict[int, str] = {}
        self.hostnet_gen = 0
        self.host_ports: dict[tuple[str, int, int], dict[tuple[str, str], PodRecord]] = {}
        self.released = 0
        # address key -> {ifindex << 16 | incarnation: (pod, None) bound, (pod, tenure
        # count) provisional, or None: seen, not bound yet} (veth_owner); cleared beyond
        # _max_veths addresses
        self.veths: dict[int, dict[int, tuple[PodRecord, int | None] | None]] = {}
        self._max_veths = max(4 * max_deleted, 65536)

    def get(self, namespace: str, name: str) -> PodRecord | None:
        """The pod, or None."""
        return self.by_name.get(namespace, {}).get(name)

    def keys(self) -> list[tuple[str, str]]:
        """Every pod as ``(namespace, name)``."""
        return [(ns, name) for ns, names in self.by_name.items() for name in names]

    def delete(self, namespace: str, name: str) -> None:
        """Remove a pod; its addresses' holds end now."""
        names = self.by_name.get(namespace)
        rec = names.pop(name, None) if names is not None else None
        if names is not None and not names:
            del self.by_name[namespace]
        if rec is not None:
            self.count -= 1
            self._index_host_ports(rec, add=False)
            self.release(rec, rec.ips)

    def _index_host_ports(self, rec: PodRecord, *, add: bool) -> None:
        """Add ``rec``'s ports of its node's address to :attr:`host_ports`, or remove them."""
        if not rec.node:
            return
        who = (rec.namespace, rec.name)
        for port, proto in rec.host_ports:
            k = (rec.node, port, proto)
            if add:
                self.host_ports.setdefault(k, {})[who] = rec
            else:
                owners = self.host_ports.get(k)
                if owners is not None:
                    owners.pop(who, None)
                    if not owners:
                        del self.host_ports[k]

    def host_port_owner(self, node: str, port: int, protocol: int) -> PodRecord | None:
        """The one live pod on ``node`` serving ``port``/``protocol`` of the node's address (a
        host-network pod's ``containerPort``/``hostPort``, another pod's ``hostPort``), or
        None when none or several do."""
        owners = self.host_ports.get((node, port, protocol))
        if owners is None or len(owners) != 1:
            return None
        return next(iter(owners.values()))

    def upsert(self, rec: PodRecord) -> None:
        """Add or replace a pod; its addresses' previous holders become tenures."""
        now = self._clock()
        names = self.by_name.setdefault(rec.namespace, {})
        old = names.get(rec.name)
        memo = self._memo
        old_ips = old.ips if old is not None and not old.terminal else ()
        new_ips = rec.ips if not rec.terminal else ()
        # a pod keeps its "since" while it keeps an address; a first address starts it
        since = old.since if old is not None and old_ips and new_ips else now
        rec = PodRecord(rec.namespace, rec.name, rec.node, rec.ips, rec.workload,
                        rec.workload_kind, rec.host_network, rec.terminal, since,
                        rec.host_ports, rec.host_port_targets)
        names[rec.name] = rec
        if old is None:
            self.count += 1
        if old is not None:
            self._index_host_ports(old, add=False)
        if not rec.terminal:
            self._index_host_ports(rec, add=True)
        if old is not None:
            if old.host_network:
                self.release(old, old.ips)
            else:
                self.release(old, [ip for ip in old_ips if ip not in new_ips or rec.host_network])
        if rec.host_network:
            if rec.node:
                for ip in rec.ips:
                    k = tagged_address_key(ip)
                    self.hostnet_by_ip[k] = rec.node
                    self.hostnet_gen += 1
                    memo.pop(k, None)
            return
        live = self.live_by_ip
        for ip in new_ips:
            k = tagged_address_key(ip)
            memo.pop(k, None)
            cur = live.get(k)
            if cur is not None and (cur.namespace != rec.namespace or cur.name != rec.name):
                if ip in old_ips:
                    # this pod claimed the address before and another pod claimed it
                    # since: a late update of the earlier holder (a terminating pod's
                    # status still lists its released IP) must not take it back; that
                    # buried the new pod for good, and once the grace ran out its bytes
                    # went to unknown until its next update
                    continue
                # the IP went to another pod before we saw the old one go
                self.bury(k, Tenure(cur, cur.since, now))
            live[k] = rec

    def release(self, rec: PodRecord, ips: Iterable[IPAddress]) -> None:
        """End ``rec``'s hold on ``ips`` (a live hold becomes a tenure with ``deleted_at`` now)."""
        now = self._clock()
        for ip in ips:
            k = tagged_address_key(ip)
            self._memo.pop(k, None)
            if rec.host_network:
                if self.hostnet_by_ip.get(k) == rec.node:
                    del self.hostnet_by_ip[k]
                    self.hostnet_gen += 1
                continue
            cur = self.live_by_ip.get(k)
            if cur is not None and cur.namespace == rec.namespace and cur.name == rec.name:
                del self.live_by_ip[k]
                self.bury(k, Tenure(cur, cur.since, now))

    def bury(self, k: int, tenure: Tenure) -> None:
        """Remember a finished tenure of the address with key ``k`` (for the grace period)."""
        self.released += 1
        self._memo.pop(k, None)
        past = self.deleted.get(k, ())
        # keep the newest few tenures per IP: enough for a reuse or two within the grace
        self.deleted[k] = (past + (tenure,))[-4:]

    def owner_at(self, k: int, at: float | None,
                 past: tuple[Tenure, ...] | None) -> PodRecord | None:
        """The pod that held the address with key ``k`` at ``at`` (None: now), given its
        finished tenures ``past`` (``deleted.get(k)``)."""
        live = self.live_by_ip.get(k)
        if not past:
            return live
        if at is None:
            return live or past[-1].pod
        for t in reversed(past):
            if t.first_seen <= at < (t.deleted_at or float("inf")):
                return t.pod
        if live is not None and at >= live.since:
            return live
        # before anything we saw (or in a gap): the nearest earlier tenure, else the live one
        earlier = [t for t in past if t.first_seen <= at]
        if earlier:
            return earlier[-1].pod
        return live or past[0].pod

    def veth_owner(self, k: int, ifindex: int, at: float, final: bool
                   ) -> tuple[PodRecord | None, bool]:
        """The pod whose bytes the host veth ``ifindex`` carried from the address with key
        ``k``: ``(pod, settled)``; ``(None, True)`` when no pod held the address in the
        grace period (the caller resolves it as any address).

        The kernel keys every flow by its veth (bpf/zonemeter.h ``ifindex``), and a pod
        replacing another on the same address has a new veth, whose ifindex is larger
        (the kernel hands interface indexes out in increasing order: ``dev_index_reserve``
        in net/core/dev.c). So the veths an address was seen on, in ifindex order, belong
        to its tenures in order (docs/datapath.md, "The veth in the key"); an index whose
        binding's tenure ended more than :data:`VETH_REUSE_SECONDS` before ``at`` is a new
        veth under the same index, ordered after it. A veth is bound
        to a tenure once the order allows only one; the binding then holds whatever the
        API says later. Unsettled (``settled`` False, nothing bound, the holder at ``at``
        returned): the veth's tenure is not known yet (a new veth while the API still
        shows the previous holder, whose veth is known), or several new veths and tenures
        meet at once; the caller holds the bytes and asks again. With ``final`` the
        likeliest tenure is bound provisionally: the binding is redone once the address's
        tenures change.
        """
        seen = self.veths.get(k)
        if seen is None:
            if len(self.veths) >= self._max_veths:
                self.veths.clear()
            seen = self.veths[k] = {}
        past = self.deleted.get(k) or ()
        live = self.live_by_ip.get(k)
        seq: list[PodRecord] = []
        for rec in [*(t.pod for t in past), *([live] if live is not None else [])]:
            if not seq or _tenure(seq[-1]) != _tenure(rec):
                seq.append(rec)
        # veths are ordered by (ifindex, incarnation): a veth re-created under the index
        # of a deleted one is a later incarnation of that index
        order = max((o for o in seen if o >> 16 == ifindex), default=ifindex << 16)
        got = seen.get(order)
        if got is not None:
            rec, stamp = got
            if stamp is None:
                end = None if live is not None and _tenure(live) == _tenure(rec) else next(
                    (t.deleted_at for t in reversed(past) if _tenure(t.pod) == _tenure(rec)), 0.0)
                if end is None or at <= end + VETH_REUSE_SECONDS:
                    return rec, True
                # its tenure ended long before these bytes: the index names a new veth
                order += 1
            elif stamp == len(seq):
                return rec, True
            else:
                seen[order] = None  # provisional, and the tenures changed: decide again
        if not seq:
            return None, True
        seen.setdefault(order, None)
        pos = {_tenure(r): i for i, r in enumerate(seq)}
        # the veths bound for good just below and above this one bound its window
        lo, hi = -1, len(seq)
        lo_o, hi_o = -1, 1 << 48
        for o, b in seen.items():
            if b is None or b[1] is not None:
                continue
            p = pos.get(_tenure(b[0]))
            if p is None:  # that tenure left the grace period
                continue
            if lo_o < o < order:
                lo, lo_o = p, o
            elif order < o < hi_o:
                hi, hi_o = p, o
        cands = seq[lo + 1:hi]
        # other veths in the same window still to be bound share its tenures
        unbound = [o for o, b in seen.items() if o != order and lo_o < o < hi_o
                   and (b is None or b[1] is not None)]
        owner = self.owner_at(k, at, past) or seq[-1]
        # veths newer than this one in the window take the newer tenures
        rank = sum(1 for o in unbound if o > order)
        if cands and len(cands) == len(unbound) + 1:  # as many veths as tenures: in order
            rec = cands[len(cands) - 1 - rank]
            seen[order] = (rec, None)
            return rec, True
        if not final:
            return owner, False
        # the likeliest: the newest tenure for the newest veth, older ones in order
        rec = cands[max(0, len(cands) - 1 - rank)] if cands else owner
        seen[order] = (rec, len(seq))
        if len(seen) > 8:  # a few veths per address are enough to order its tenures
            for o in sorted(seen)[:len(seen) - 8]:
                del seen[o]
        return rec, True

    def live_workloads(self, want: set[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        """The workloads of ``want`` (``(namespace, workload, workload_kind)``) that at least
        one pod belongs to (terminal pods count).

        A kind-``Pod`` workload is one lookup; the others scan the pods of their
        namespace, once per namespace per call.
        """
        live: set[tuple[str, str, str]] = set()
        scan: set[str] = set()
        for ns, wl, kind in want:
            if kind == "Pod":
                rec = self.by_name.get(ns, {}).get(wl)
                if rec is not None and rec.workload == wl and rec.workload_kind == "Pod":
                    live.add((ns, wl, kind))
            else:
                scan.add(ns)
        for ns in scan:
            for rec in self.by_name.get(ns, {}).values():
                key = (ns, rec.workload, rec.workload_kind)
                if key in want:
                    live.add(key)
        return live
