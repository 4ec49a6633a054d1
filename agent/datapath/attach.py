"""Load the zonemeter BPF programs with BCC and attach them to pod veths.

One :class:`Datapath` per node: it compiles ``bpf/tc.c`` once (BCC, ``-D`` options from
:class:`agent.datapath.config.DatapathConfig`), attaches ``zm_tc_from_pod`` to the
ingress and ``zm_tc_to_pod`` to the egress of every pod veth (host side) in the node's
network namespace, as TCX links at the head of the device's list
(:mod:`agent.datapath.tcx`, Linux 6.6+) or as clsact filters (pyroute2) on kernels
without TCX (``DatapathConfig.attach``), follows links appearing and disappearing
(RTM_NEWLINK/RTM_DELLINK), writes the node's local Service endpoints into the kernel,
and hands out :class:`agent.records.FlowDelta` records (:meth:`Datapath.drain`, through
:class:`agent.datapath.drain.FlowTables`). BCC and pyroute2 objects never leave
:mod:`agent.datapath`.

Restart without loss: with ``DatapathConfig.pin_path`` every map is pinned on a BPF
filesystem (:mod:`agent.datapath.pins`). The kernel keeps counting while no agent runs;
a restarted agent reuses the pins, atomically swaps its programs in (``BPF_LINK_UPDATE``
on the pinned TCX links, or ``replace`` of the tc filters at the same priority and
handle: never a second attachment, never a gap) and drains what accumulated.
:meth:`Datapath.release` leaves filters and pins in place for the next agent;
:meth:`Datapath.cleanup` removes both (docs/datapath.md).
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import ipaddress
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agent.datapath import cgroup, tcx
from agent.datapath.abi import (
    LAYOUT_VERSION,
    PORT_ENDPOINT,
    PORT_SERVICE,
    addr_from_bytes,
    endpoint_key,
)
from agent.datapath.config import (
    CGROUP_SOURCE,
    DEFAULT_TC_HANDLE,
    DEFAULT_TC_PRIORITY,
    TC_SOURCE,
    DatapathConfig,
    check_pin_path,
    flags_for,
)
from agent.datapath.drain import FlowTables, HandOver, TableStats
from agent.datapath.netns import read_ephemeral_range, run_in_netns
from agent.datapath.pins import PINNED_MAPS, lock_pins, make_pin_dir, on_bpf_fs, prepare_pins
from agent.errors import InputError, RuntimeFailure
from agent.records import FlowDelta, IPAddress

log = logging.getLogger(__name__)

#: clsact parents: TC_H_CLSACT | TC_H_MIN_INGRESS / TC_H_MIN_EGRESS (include/uapi/linux/pkt_sched.h)
PARENT_INGRESS = 0xFFFFFFF2
PARENT_EGRESS = 0xFFFFFFF3
#: tc filter protocol: every frame (include/uapi/linux/if_ether.h)
ETH_P_ALL = 0x0003
_PROGRAMS = ((PARENT_INGRESS, "zm_tc_from_pod"), (PARENT_EGRESS, "zm_tc_to_pod"))
#: the TCX programs, in the order of agent.datapath.tcx.SIDES (ingress, egress)
_TCX_PROGRAMS = ("zm_tcx_from_pod", "zm_tcx_to_pod")
#: the uplink programs (bpf/uplink.h: the first hop of a node port), clsact and TCX
_UPLINK_PROGRAMS = ((PARENT_INGRESS, "zm_tc_up_in"), (PARENT_EGRESS, "zm_tc_up_out"))
_TCX_UPLINK_PROGRAMS = ("zm_tcx_up_in", "zm_tcx_up_out")
#: what a device carries: a pod veth's programs or an uplink's (clsact, TCX, link pin prefix)
POD, UPLINK = "pod", "uplink"
#: the TCX program of the last step of a switch to clsact (bpf/tc.c)
_TCX_HANDOFF = "zm_tcx_handoff"
_TC_NAME_PREFIX = "zm_tc_"
#: pin file of a TCX link of ours: zm_link_<ifindex>_<ingress|egress> under pin_path (a pod
#: veth's), zm_uplink_<ifindex>_<side> (an uplink's)
_LINK_PIN_PREFIX = "zm_link_"
_UPLINK_PIN_PREFIX = "zm_uplink_"
_ROLES = {POD: (_PROGRAMS, _TCX_PROGRAMS, _LINK_PIN_PREFIX),
          UPLINK: (_UPLINK_PROGRAMS, _TCX_UPLINK_PROGRAMS, _UPLINK_PIN_PREFIX)}


def link_pin_name(ifindex: int, side: str, role: str = POD) -> str:
    """Return the pin file name of our TCX link on ifindex, side ``"ingress"``/``"egress"``,
    of a pod veth (``role`` ``"pod"``) or an uplink (``"uplink"``)."""
    return f"{_ROLES[role][2]}{ifindex}_{side}"


#: getsockopt(SOL_SOCKET, SO_NETNS_COOKIE) (include/uapi/asm-generic/socket.h)
SO_NETNS_COOKIE = 71


def netns_cookie() -> int:
    """The cookie of the calling thread's network namespace (``SO_NETNS_COOKIE``, as
    ``bpf_get_netns_cookie`` returns it). Raises OSError when the kernel has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), sys.byteorder)


def _detach_and_close(fd: int) -> None:
    """Detach the TCX link behind fd at once (a link already defunct is no error) and
    close fd."""
    try:
        tcx.link_detach(fd)
    except OSError as err:
        if err.errno not in (errno.ENOLINK, errno.ENOENT, errno.EINVAL):
            log.warning("cannot detach TCX link: %s", err)
    finally:
        os.close(fd)


def _link_pin_ifindex(name: str) -> int | None:
    """The ifindex in a link pin name (see :func:`link_pin_name`, either role), None for
    other files."""
    for prefix in (_LINK_PIN_PREFIX, _UPLINK_PIN_PREFIX):
        if name.startswith(prefix):
            head, _, side = name[len(prefix):].partition("_")
            return int(head) if head.isdigit() and side in ("ingress", "egress") else None
    return None


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """What :meth:`Datapath.cleanup` removed.

    Attributes:
        filters: ``(interface name, "ingress" | "egress")`` of each filter of ours deleted.
        pins: names of the pinned maps unlinked (see :data:`PINNED_MAPS`).
        links: names of the TCX link pins unlinked (``zm_link_<ifindex>_<side>``); the
            kernel detaches a link when its last pin and fd are gone.
    """

    filters: tuple[tuple[str, str], ...]
    pins: tuple[str, ...]
    links: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DatapathStats:
    """Self-health of one datapath (feeds ``zonemeter_flow_table_*`` and
    ``zonemeter_attached_interfaces``).

    Attributes:
        attached: host-side interface names our filters are on.
        table: flow table health (:class:`agent.datapath.drain.TableStats`).
        endpoints: local endpoints currently written to the kernel.
        attach_mode: ``"tcx"``, ``"clsact"`` or ``"cgroup"``: how the programs are attached
            (``DatapathConfig.attach`` resolved against the kernel).
        uplinks: the uplinks the first hop of node ports is counted on (``entry_hops``).
        entries: entry addresses (``(address, port, protocol)``) written to the kernel.
    """

    attached: tuple[str, ...]
    table: TableStats
    endpoints: int
    attach_mode: str = "clsact"
    uplinks: tuple[str, ...] = ()
    entries: int = 0


@dataclass(frozen=True, slots=True)
class InterfaceBytes:
    """What one attached host-side veth carried between two drains, by the device's own
    counters (netlink ``IFLA_STATS64``): L2 bytes (``skb->len`` with the 14-byte
    Ethernet header) and packets, every frame (ARP included).

    The host side *receives* what the pod sends (the ingress hook sees it) and
    *transmits* what the pod receives (the egress hook). With one skb per wire packet,
    ``rx_bytes - 14 * rx_packets`` is the L3 bytes our ingress program should have
    counted, less non-IP frames; far less counted means something starves the hook
    (docs/datapath.md, "Interface counters").

    Attributes:
        name: interface name.
        rx_bytes, rx_packets: received by the host side (leaving the pod).
        tx_bytes, tx_packets: transmitted by the host side (entering the pod).
    """

    name: str
    rx_bytes: int
    rx_packets: int
    tx_bytes: int
    tx_packets: int


#: net_device_flags IFF_LOOPBACK (include/uapi/linux/if.h)
IFF_LOOPBACK = 0x8
#: link kinds that stand for their slaves on the wire: the slaves (no kind, enslaved)
#: are left out, the master is an uplink
_BONDING_KINDS = ("bond", "team")


@dataclass(frozen=True, slots=True)
class LinkFacts:
    """What :func:`select_uplinks` needs of one link (an RTM_NEWLINK message).

    Attributes:
        index: ifindex.
        name: interface name.
        kind: ``IFLA_INFO_KIND`` (``"veth"``, ``"vxlan"``, ``"bond"``...), None for a
            device without one: a physical (or paravirtual) NIC.
        loopback: ``IFF_LOOPBACK`` is set.
        master: ``IFLA_MASTER``: the bond, team or bridge it is enslaved to, or None.
    """

    index: int
    name: str
    kind: str | None
    loopback: bool
    master: int | None


def _link_facts(link: Any) -> LinkFacts:
    info = link.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    return LinkFacts(int(link["index"]), link.get_attr("IFLA_IFNAME") or "", kind,
                     bool(link["flags"] & IFF_LOOPBACK), link.get_attr("IFLA_MASTER") or None)


def select_uplinks(links: Iterable[LinkFacts], patterns: Iterable[str],
                   default_route_oifs: Callable[[], set[int]]) -> set[int]:
    """The ifindexes of the node's uplinks, for the cgroup hook's coverage check
    (docs/datapath.md, "Interface counters").

    With ``patterns``: the links whose name matches one (fnmatch). Else every device that
    puts packets on the wire itself: no link kind (a NIC) or a bond/team master, not
    loopback, not enslaved (a bond's slaves and a bridge's ports are counted by their
    master, or not at all). When there is none (a node whose only way out is a veth or
    a bridge: a container node, a lab node), the devices of the default routes.
    Tunnel devices (vxlan, geneve, ipip, wireguard) are never uplinks: their packets
    leave encapsulated through an uplink, which counts them.

    Args:
        links: every link of the node's namespace.
        patterns: ``DatapathConfig.uplink_patterns``.
        default_route_oifs: returns the output devices of the default routes (called
            only when needed: one more netlink dump).
    """
    links = list(links)
    pats = tuple(patterns)
    if pats:
        return {ln.index for ln in links if any(fnmatch.fnmatchcase(ln.name, p) for p in pats)}
    wire = {ln.index for ln in links
            if (ln.kind is None or ln.kind in _BONDING_KINDS) and not ln.loopback
            and ln.master is None}
    if wire:
        return wire
    present = {ln.index for ln in links if not ln.loopback}
    return default_route_oifs() & present


def _drain_events(fd: int) -> int:
    """Read and discard every datagram waiting on netlink socket ``fd`` without blocking.

    Args:
        fd: file descriptor of a netlink socket bound to multicast groups.

    Returns:
        the number of datagrams discarded. A receive-buffer overrun (ENOBUFS: the kernel
        dropped events) counts as one: the caller rescans all links anyway.

    Raises:
        OSError: any receive error other than EAGAIN and ENOBUFS.
    """
    sock = socket.socket(fileno=os.dup(fd))
    count = 0
    try:
        while True:
            try:
                sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return count
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
            count += 1
    finally:
        sock.close()


def _nl_code(err: BaseException) -> int | None:
    """Return the errno a pyroute2 NetlinkError carries (its ``code``), None for other errors."""
    code = getattr(err, "code", None)
    return code if isinstance(code, int) else None


def _err_code(err: BaseException) -> int | None:
    """The errno of a pyroute2 NetlinkError or of an OSError (bpf(2)), else None."""
    code = _nl_code(err)
    if code is None and isinstance(err, OSError):
        code = err.errno
    return code


def _delete_our_filters(ipr: Any, index: int, tc_priority: int, tc_handle: int) -> list[str]:
    """Delete the bpf filters of ours on link index (both clsact sides); return the sides
    (``"ingress"``/``"egress"``) where one was deleted.

    A filter is ours when it has our priority and handle and its program name starts with
    ``zm_tc_``; others are never touched. A link without clsact has none.

    Raises:
        Exception: the pyroute2 NetlinkError of a refused delete (other than ENOENT/ENODEV).
    """
    removed: list[str] = []
    for parent, side in ((PARENT_INGRESS, "ingress"), (PARENT_EGRESS, "egress")):
        try:
            filters = ipr.get_filters(index=index, parent=parent)
        except Exception:  # noqa: BLE001 - no clsact on this link
            continue
        mine = False
        for f in filters:
            opts = f.get_attr("TCA_OPTIONS")
            if (f["handle"] == tc_handle and f["info"] >> 16 == tc_priority
                    and opts is not None and (opts.get_attr("TCA_BPF_NAME") or "")
                    .startswith(_TC_NAME_PREFIX)):
                mine = True
        if not mine:
            continue
        try:
            ipr.tc("del-filter", "bpf", index, tc_handle, parent=parent,
                   prio=tc_priority, protocol=ETH_P_ALL)
        except Exception as err:
            if _nl_code(err) not in (errno.ENOENT, errno.ENODEV):
                raise
            continue
        removed.append(side)
    return removed


class Datapath:
    """The BPF programs of one node, attached to its pod veths.

    Args:
        config: see :class:`DatapathConfig`.

    Raises:
        InputError: a setting is out of range.
        RuntimeFailure: BCC cannot compile or load the programs.

    Thread safety: :meth:`drain`, :meth:`set_local_endpoints`, :meth:`attach`,
    :meth:`stats` may be called from any thread; netlink sockets are per thread.
    """

    def __init__(self, config: DatapathConfig | None = None) -> None:
        self.config = config or DatapathConfig()
        self.config.validate()
        lo, hi = self.config.ephemeral_ports or read_ephemeral_range(self.config.netns)
        self._ephemeral = (lo, hi)
        self._lock = threading.RLock()
        self._local = threading.local()
        self._sockets: list[object] = []
        self._attached: dict[int, str] = {}  # ifindex -> name (pod veths and uplinks)
        self._roles: dict[int, str] = {}  # ifindex -> POD or UPLINK (absent: POD)
        self._entries: set[tuple[IPAddress, int, int]] = set()
        self._created_qdisc: set[int] = set()
        self._links: dict[int, list[int]] = {}  # ifindex -> TCX link fds (ingress, egress)
        # ifindex -> (name, rx_bytes, rx_packets, tx_bytes, tx_packets): the counters read
        # at the last drain, and what they gained between the last two drains
        self._if_counters: dict[int, tuple[str, int, int, int, int]] = {}
        self._if_gained: dict[int, InterfaceBytes] = {}
        self._endpoints: set[tuple[IPAddress, int, int]] = set()
        #: ports marked ZM_PORT_SERVICE in zm_endpoint_ports (set_service_ports)
        self._service_ports: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._closed = False
        #: why the hook is what it is (one line, for the start-up log)
        self.hook_reason = ""
        #: "veth" or "cgroup": DatapathConfig.hook resolved against this node
        self.hook = self._resolve_hook()
        if self.config.hook == "auto":
            log.info("hook auto: counting at the %s (%s)",
                     "sockets (cgroup_skb)" if self.hook == "cgroup" else "pod veths", self.hook_reason)
        self._cgroup: cgroup.CgroupLinks | None = None
        #: "tcx" or "clsact": DatapathConfig.attach resolved against this kernel; "cgroup"
        #: for the cgroup hook
        self.attach_mode = "cgroup" if self.hook == "cgroup" else self._resolve_attach_mode()
        #: how the uplink programs attach (``"tcx"`` or ``"clsact"``), None without entry_hops
        self.uplink_mode: str | None = None
        if self.config.entry_hops:
            self.uplink_mode = (self.attach_mode if self.hook != "cgroup"
                                else self._resolve_attach_mode())
        try:
            from bcc import BPF
        except ImportError as err:  # pragma: no cover - depends on the machine
            raise RuntimeFailure("the bcc module is missing: run tools/setup.sh") from err
        self._pin_lock: int | None = None
        #: True when maps pinned by a previous agent were found and reused
        self.reused = False
        if self.config.pin_path:
            # lock first: never inspect, let alone recreate, pins another agent still uses
            make_pin_dir(self.config.pin_path)
            self._pin_lock = lock_pins(self.config.pin_path, self.config.pin_lock_seconds)
        try:
            if self.config.pin_path:
                self.reused = prepare_pins(self.config)
            source = CGROUP_SOURCE if self.hook == "cgroup" else TC_SOURCE
            try:
                self._bpf = BPF(src_file=str(source).encode(), cflags=self.cflags())
                tc_progs: tuple[str, ...] = ()
                if self.hook == "cgroup":
                    self._fns = {prog: self._bpf.load_func(prog.encode(), BPF.CGROUP_SKB)
                                 for _, _, prog in cgroup.SIDES}
                    if self.config.socket_counters:
                        self._fns[cgroup.RELEASE[2]] = self._bpf.load_func(
                            cgroup.RELEASE[2].encode(), BPF.CGROUP_SOCK,
                            attach_type=cgroup.BPF_CGROUP_INET_SOCK_RELEASE)
                else:
                    self._fns = {}
                    tc_progs = (*(n for _, n in _PROGRAMS), *_TCX_PROGRAMS)
                if self.config.entry_hops:
                    tc_progs += (*(n for _, n in _UPLINK_PROGRAMS), *_TCX_UPLINK_PROGRAMS)
                if tc_progs:
                    tc_progs += (_TCX_HANDOFF,)
                self._fns.update({name: self._bpf.load_func(name.encode(), BPF.SCHED_CLS)
                                  for name in tc_progs})
            except Exception as err:
                raise RuntimeFailure(f"cannot load {source}: {err}") from err
        except BaseException:
            if self._pin_lock is not None:
                os.close(self._pin_lock)
            raise
        b = self._bpf
        self.tables = FlowTables(
            (b[b"zm_flows_a"].get_fd(), b[b"zm_flows_b"].get_fd()),
            b[b"zm_active"].get_fd(), b[b"zm_lost"].get_fd(), self.config.flow_capacity,
            reuse=self.reused,
            caches=((b[b"zm_cache_a"].get_fd(), b[b"zm_cache_b"].get_fd()),
                    b[b"zm_cache_active"].get_fd()),
            epoch_fd=b[b"zm_epoch"].get_fd())
        self._endpoint_map = b[b"zm_endpoints"]
        self._endpoint_ports = b[b"zm_endpoint_ports"]
        self._entry_map = b[b"zm_entries"]
        self._entry_ports = b[b"zm_entry_ports"]
        if self.reused:
            # the previous agent's endpoints and entries keep classifying until
            # set_local_endpoints / set_entry_points, its Service ports until
            # set_service_ports
            self._endpoints = self._kernel_endpoints(self._endpoint_map)
            self._entries = self._kernel_endpoints(self._entry_map)
            self._service_ports = frozenset(
                int(k) for k, v in self._endpoint_ports.items_lookup_batch()
                if int(v) & PORT_SERVICE)
        elif self.config.pin_path:
            b[b"zm_layout"][ctypes.c_int(0)] = ctypes.c_uint32(LAYOUT_VERSION)
        if self.reused:
            log.info("reusing pinned maps in %s", self.config.pin_path)
        if self.hook == "cgroup":
            self._set_scope(self.config.scope_netns)

    @property
    def cgroup_root(self) -> str | None:
        """The cgroup2 directory the cgroup hook attaches to (its pods' cgroups are below
        it: :class:`agent.datapath.cgroup.PodCgroupOrder`), None on the veth hook."""
        return self._cgroup_root if self.hook == "cgroup" else None

    def _resolve_hook(self) -> str:
        """Return ``"veth"`` or ``"cgroup"`` for ``config.hook``; sets ``self._cgroup_root``
        and ``self.hook_reason`` (why, one line, for the start-up log).

        ``auto`` takes cgroup when the datapath is not confined to a namespace, a cgroup2
        filesystem is mounted (or ``cgroup_root`` names one), its directory is the root
        of the hierarchy (so its programs run for every socket of the machine, not for a
        container's own cgroup namespace) and a cgroup_skb link attaches there
        (:func:`agent.datapath.cgroup.probe`); else veth (docs/datapath.md, "Which hook:
        auto").

        Raises:
            RuntimeFailure: cgroup was asked for and no cgroup v2 hierarchy is mounted.
        """
        want = self.config.hook
        self._cgroup_root = None
        if want == "veth":
            self.hook_reason = "asked for"
            return "veth"
        if want == "auto" and self.config.netns is not None:
            self.hook_reason = "a namespaced datapath (a lab node) counts at the pod veths"
            return "veth"
        try:
            root = cgroup.cgroup2_root(under=self.config.cgroup_root)
        except RuntimeFailure as err:
            if want == "cgroup":
                raise
            self.hook_reason = str(err)
            return "veth"
        self._cgroup_root = root
        try:
            whole = cgroup.is_hierarchy_root(root)
        except OSError as err:
            if want == "cgroup":
                raise RuntimeFailure(f"cgroup root {root}: {err}") from err
            self.hook_reason = f"cannot read {root}: {err.strerror}"
            return "veth"
        if not whole:
            why = (f"{root} is not the root of the cgroup v2 hierarchy (a container's own "
                   "cgroup namespace?): its programs would count only the sockets of cgroups "
                   "below it; mount the host's cgroup2 root and pass it as --cgroup-root")
            if want == "cgroup":
                log.warning("%s", why)
            else:
                self.hook_reason = why
                return "veth"
        if want == "cgroup":
            self.hook_reason = "asked for"
            return "cgroup"
        failure = cgroup.probe(root)
        if failure is not None:
            self.hook_reason = failure
            return "veth"
        self.hook_reason = f"a cgroup_skb link attaches on the cgroup v2 root {root}"
        return "cgroup"

    def _set_scope(self, namespaces: Iterable[str]) -> None:
        """Write the cgroup programs' scope (``zm_scope``, bpf/cgroup.c): the cookie of
        each network namespace named. Raises RuntimeFailure when one cannot be entered."""
        if not namespaces:
            return
        scope = self._bpf[b"zm_scope"]
        for name in namespaces:
            try:
                cookie = run_in_netns(name, netns_cookie)
            except OSError as err:
                raise RuntimeFailure(f"cannot read the cookie of netns {name}: {err}") from err
            scope[ctypes.c_uint64(cookie)] = ctypes.c_uint32(1)

    def _resolve_attach_mode(self) -> str:
        """Return ``"tcx"`` or ``"clsact"`` for ``config.attach``: auto takes tcx when
        :func:`agent.datapath.tcx.tcx_supported` says the kernel has it.

        Raises:
            RuntimeFailure: tcx was asked for and the kernel has none, or the probe failed.
        """
        want = self.config.attach
        if want == "clsact":
            return "clsact"
        try:
            has = tcx.tcx_supported(self.config.netns)
        except OSError as err:
            raise RuntimeFailure(f"cannot probe the kernel for TCX: {err}") from err
        if has:
            return "tcx"
        if want == "tcx":
            raise RuntimeFailure("attach 'tcx' asked for, but this kernel has no TCX "
                                 "(Linux 6.6+): use attach 'auto' or 'clsact'")
        log.info("no TCX in this kernel: attaching clsact filters")
        return "clsact"

    @staticmethod
    def _kernel_endpoints(table: Any) -> set[tuple[IPAddress, int, int]]:
        """The set held by a (pinned) kernel map keyed by ``struct zm_endpoint_key``
        (``zm_endpoints``, ``zm_entries``), as set_local_endpoints / set_entry_points keep it."""
        out: set[tuple[IPAddress, int, int]] = set()
        for key in table.keys():
            raw = bytes(key.addr)
            family = 4 if raw[:12] == b"\x00" * 10 + b"\xff\xff" else 6
            out.add((addr_from_bytes(raw, family), socket.ntohs(key.port), int(key.proto)))
        return out

    # -- compile ----------------------------------------------------------------------

    def cflags(self) -> list[str]:
        """Return the BCC cflags (``-I``, ``-D`` options) the programs are compiled with."""
        return flags_for(self.config, self._ephemeral)

    # -- netlink helpers ----------------------------------------------------------------

    def _ipr(self) -> Any:
        """Return this thread's pyroute2 IPRoute socket in the node namespace."""
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            from pyroute2 import IPRoute

            ipr = IPRoute(netns=self.config.netns) if self.config.netns else IPRoute()
            self._local.ipr = ipr
            with self._lock:
                self._sockets.append(ipr)
        return ipr

    def _wanted(self, link: Any) -> bool:
        """Return whether a link (a pyroute2 RTM_NEWLINK message) is a pod veth we should attach."""
        name = link.get_attr("IFLA_IFNAME") or ""
        if any(fnmatch.fnmatchcase(name, p) for p in self.config.exclude_patterns):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in self.config.interface_patterns):
            return True
        if not self.config.require_peer_netns:
            return False
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        return kind == "veth" and link.get_attr("IFLA_LINK_NETNSID") is not None

    # -- attach / detach ----------------------------------------------------------------

    def _link_pin(self, index: int, side: str) -> str | None:
        """Path of the pin of our TCX link on index/side (of the device's role), None
        without pin_path."""
        if not self.config.pin_path:
            return None
        return os.path.join(self.config.pin_path,
                            link_pin_name(index, side, self._roles.get(index, POD)))

    def _mode(self, index: int) -> str | None:
        """``"tcx"`` or ``"clsact"``: how the programs of the device's role attach."""
        return self.uplink_mode if self._roles.get(index) == UPLINK else self.attach_mode

    def _take_over(self, index: int, attach_type: int, side: str) -> int | None:
        """Return an fd of the pinned TCX link a previous agent left on index/side, or
        None when there is none. A pin that is no live TCX link of that device and side
        (its device was deleted, the ifindex reused) is unlinked: it counts nothing."""
        def is_ours(fd: int) -> bool:
            info = tcx.link_info(fd)
            return (info.type, info.ifindex, info.attach_type) == (
                tcx.BPF_LINK_TYPE_TCX, index, attach_type)

        return tcx.take_over_pin(self._link_pin(index, side), is_ours)

    def _replace_filters(self, index: int) -> None:
        """Put our clsact programs on link index with ``replace`` (same priority and
        handle: a filter of ours already there is swapped atomically, never doubled).

        Raises:
            Exception: the pyroute2 NetlinkError of a refusal.
        """
        ipr = self._ipr()
        for parent, prog in _ROLES[self._roles.get(index, POD)][0]:
            fn = self._fns[prog]
            # replace: a filter left by a previous run of ours (same prio and handle)
            # is swapped for this one instead of running twice; others are untouched
            ipr.tc("replace-filter", "bpf", index, self.config.tc_handle, fd=fn.fd,
                   name=prog, parent=parent, classid=1, direct_action=True,
                   prio=self.config.tc_priority, protocol=ETH_P_ALL)

    def _has_our_filter(self, index: int) -> bool:
        """Whether a clsact filter of ours (priority, handle, ``zm_tc_`` name) is on index."""
        ipr = self._ipr()
        for parent, _ in _ROLES[self._roles.get(index, POD)][0]:
            try:
                filters = ipr.get_filters(index=index, parent=parent)
            except Exception:  # noqa: BLE001 - no clsact on this link
                return False
            for f in filters:
                opts = f.get_attr("TCA_OPTIONS")
                if (f["handle"] == self.config.tc_handle
                        and f["info"] >> 16 == self.config.tc_priority and opts is not None
                        and (opts.get_attr("TCA_BPF_NAME") or "").startswith(_TC_NAME_PREFIX)):
                    return True
        return False

    def _attach_tcx(self, index: int, name: str) -> None:
        """Attach both programs to link index as TCX links at the head of its lists (or
        take over the pinned links of a previous agent with ``BPF_LINK_UPDATE``), pin new
        links with pin_path, then delete any clsact filter of ours left on the link by a
        clsact agent (else the bytes would be counted twice). On an error the links made
        here are closed and the OSError re-raised.

        Switching a link from clsact: the old filter first gets this agent's clsact
        program (``replace``), which skips every packet this agent's TCX program counted
        (``zm_tcx_ran``, bpf/maps.h); then the links are created; then the filter is
        deleted. Every packet is counted once throughout (docs/datapath.md)."""
        if self._has_our_filter(index):
            self._replace_filters(index)
        fds: list[int] = []
        made: list[str] = []
        try:
            for (attach_type, side), prog in zip(tcx.SIDES, _ROLES[self._roles.get(index, POD)][1],
                                                 strict=True):
                prog_fd = self._fns[prog].fd
                fd = self._take_over(index, attach_type, side)
                if fd is not None:
                    fds.append(fd)
                    tcx.link_update(fd, prog_fd)  # atomic swap, the link keeps its place
                    continue

                def create(prog_fd: int = prog_fd, attach_type: int = attach_type) -> int:
                    return tcx.link_create(prog_fd, index, attach_type, tcx.BPF_F_BEFORE)

                fd = run_in_netns(self.config.netns, create)
                fds.append(fd)
                path = self._link_pin(index, side)
                if path is not None:
                    tcx.obj_pin(fd, path)
                    made.append(path)
        except BaseException:
            for path in made:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            for fd in fds:
                os.close(fd)
            raise
        self._links[index] = fds
        self._attached[index] = name
        log.info("attached TCX links to %s (ifindex %d)", name, index)
        try:  # clsact -> tcx upgrade: the old filter would count every packet again
            for side in _delete_our_filters(self._ipr(), index, self.config.tc_priority,
                                            self.config.tc_handle):
                log.info("removed the clsact %s filter of a previous agent from %s", side, name)
        except Exception as err:  # noqa: BLE001 - retried at the next scan
            log.warning("cannot remove our old clsact filter from %s: %s", name, err)

    def _hand_off(self, links: list[int]) -> None:
        """Last step before detaching TCX links of ours whose device now has our clsact
        filters: swap ``zm_tcx_handoff`` in (counts nothing, clears the mark: the
        filters count every packet from now on), wait until no older program of ours
        runs any more, and clear every CPU's mark, which nothing but zeros is written to
        now. Without the clearing, a mark left on a CPU from before the filters existed
        would make the clsact program skip that CPU's next packet on the hook once the
        links are gone (docs/datapath.md, "Switching between clsact and TCX").

        Raises:
            RuntimeFailure: a bpf() call failed (the caller's links still count).
        """
        from agent.datapath.pins import call_errno, libbcc

        handoff = self._fns[_TCX_HANDOFF].fd
        try:
            for fd in links:
                tcx.link_update(fd, handoff)
        except OSError as err:
            raise RuntimeFailure(f"cannot hand the TCX links over to clsact: {err}") from err
        ran = self._bpf[b"zm_tcx_ran"]
        zero_key = ctypes.c_int(0)
        inner = ctypes.c_int(ran.get_fd())
        res = libbcc().bpf_update_elem(self._bpf[b"zm_grace"].get_fd(), ctypes.byref(zero_key),
                                       ctypes.byref(inner), 0)
        if res < 0:  # the grace period is what makes the clearing below exact
            raise RuntimeFailure(f"cannot wait for a grace period: errno {call_errno(res)}")
        from bcc.utils import get_possible_cpus

        zeros = (ctypes.c_uint64 * len(get_possible_cpus()))()  # a value is 8-byte aligned per CPU
        res = libbcc().bpf_update_elem(ran.get_fd(), ctypes.byref(zero_key), ctypes.byref(zeros), 0)
        if res < 0:
            raise RuntimeFailure(f"cannot clear zm_tcx_ran: errno {call_errno(res)}")

    def _forget_links(self, index: int) -> None:
        """Detach and close our TCX links of index and unlink their pins (a link whose
        device is gone is already defunct)."""
        for fd in self._links.pop(index, []):
            _detach_and_close(fd)
        for _, side in tcx.SIDES:
            path = self._link_pin(index, side)
            if path is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def _prune_link_pins(self, present: Iterable[int]) -> None:
        """Unlink TCX link pins no attachment of ours needs any more: of devices gone
        (present: the ifindexes in the namespace now), and in clsact mode of devices our
        clsact filters now count (a tcx -> clsact switch)."""
        if not self.config.pin_path:
            return
        present = set(present)
        try:
            names = os.listdir(self.config.pin_path)
        except OSError:
            return
        for pin in names:
            index = _link_pin_ifindex(pin)
            if index is None or index in self._links:
                continue
            role = UPLINK if pin.startswith(_UPLINK_PIN_PREFIX) else POD
            mode = self.uplink_mode if role == UPLINK else self.attach_mode
            if index in present and mode == "tcx":
                continue  # not attached this scan (an error): keep what still counts
            if index in present and index not in self._attached and mode is not None:
                continue  # clsact attach failed here: the old link still counts
            log.info("removing TCX link pin %s", pin)
            path = os.path.join(self.config.pin_path, pin)
            try:
                _detach_and_close(tcx.obj_get(path))
            except OSError:
                pass
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _attach_link(self, index: int, name: str) -> None:
        """Put both programs on link ``index`` (TCX links, or clsact filters with clsact
        created when missing); on any error remove what was added and re-raise the
        pyroute2 NetlinkError or the OSError of bpf(2)."""
        if self._mode(index) == "tcx":
            self._attach_tcx(index, name)
            return
        ipr = self._ipr()
        # tcx -> clsact: pinned links of a previous agent first get this agent's TCX
        # programs, so that the clsact programs below skip what they count; the links
        # are dropped once the filters are in (docs/datapath.md)
        old: list[int] = []
        for (attach_type, side), prog in zip(tcx.SIDES, _ROLES[self._roles.get(index, POD)][1],
                                             strict=True):
            fd = self._take_over(index, attach_type, side)
            if fd is not None:
                old.append(fd)
                try:
                    tcx.link_update(fd, self._fns[prog].fd)
                except OSError as err:
                    log.warning("cannot update the old TCX link on %s: %s", name, err)
        try:
            ipr.tc("add", "clsact", index)
            self._created_qdisc.add(index)
        except Exception as err:  # NetlinkError
            if _nl_code(err) != errno.EEXIST:
                for fd in old:
                    os.close(fd)
                raise
        try:
            self._replace_filters(index)
        except Exception:
            for fd in old:
                os.close(fd)
            self._attached[index] = name
            try:  # never leave half an attachment behind (ingress without egress)
                self._detach_link(index)
            except Exception as err:  # noqa: BLE001 - the original error matters more
                log.warning("cannot roll back %s: %s", name, err)
            raise
        self._attached[index] = name
        if old:
            try:
                self._hand_off(old)
            except RuntimeFailure as err:  # detached anyway: at worst a packet per CPU skipped
                log.warning("%s", err)
            for fd in old:
                _detach_and_close(fd)
            for _, side in tcx.SIDES:
                path = self._link_pin(index, side)
                if path is not None and os.path.exists(path):
                    os.unlink(path)  # the last reference: the kernel detaches the link
            log.info("replaced the TCX links of a previous agent on %s", name)
        log.info("attached to %s (ifindex %d)", name, index)

    def _detach_link(self, index: int) -> None:
        """Remove our TCX links or filters from link ``index`` (and the clsact qdisc we
        created, when nothing else is left on it); a link already gone is no error."""
        if index in self._links:
            self._forget_links(index)
            name = self._attached.pop(index, None)
            log.info("detached from %s (ifindex %d)", name, index)
            return
        ipr = self._ipr()
        progs = _ROLES[self._roles.get(index, POD)][0]
        for parent, _ in progs:
            try:
                ipr.tc("del-filter", "bpf", index, self.config.tc_handle, parent=parent,
                       prio=self.config.tc_priority, protocol=ETH_P_ALL)
            except Exception as err:
                if _nl_code(err) not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                    raise
        if index in self._created_qdisc:
            self._created_qdisc.discard(index)
            try:
                left = [f for parent, _ in progs
                        for f in ipr.get_filters(index=index, parent=parent)]
                if not left:
                    ipr.tc("del", "clsact", index)
            except Exception as err:
                if _nl_code(err) not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                    raise
        name = self._attached.pop(index, None)
        log.info("detached from %s (ifindex %d)", name, index)

    def attach(self) -> tuple[str, ...]:
        """Attach to every wanted link now present; forget links that are gone.

        Idempotent: links already attached are left alone; a filter of ours left by a
        crashed previous run is replaced, never duplicated; a pinned TCX link of a
        previous agent is taken over. TCX link pins of devices gone are unlinked.

        Returns:
            names of the interfaces attached after the scan.

        Raises:
            RuntimeFailure: some wanted link could not be attached (the others still are;
                the message names each failed link). A refusal at our priority usually
                means another filter kind or protocol holds it: set ``tc_priority``.
        """
        if self.hook == "cgroup":
            self._attach_cgroup()
            if self.uplink_mode is None:
                return self.attached()
        failures: list[str] = []
        with self._lock:
            msgs = list(self._ipr().get_links())
            links = {link["index"]: link for link in msgs}
            uplinks: set[int] = set()
            if self.uplink_mode is not None:
                uplinks = select_uplinks([_link_facts(link) for link in msgs],
                                         self.config.uplink_patterns, self._default_route_oifs)
            for index in list(self._attached):
                if index not in links:
                    self._attached.pop(index, None)
                    self._created_qdisc.discard(index)
                    self._forget_links(index)
                    self._roles.pop(index, None)
            for index, link in links.items():
                name = link.get_attr("IFLA_IFNAME")
                # an uplink is never a pod veth, whatever the veth rules say (a lab node's
                # uplink is a veth with its peer in another namespace)
                role = UPLINK if index in uplinks else (
                    POD if self.hook == "veth" and self._wanted(link) else None)
                if index in self._attached:
                    if self._attached[index] == name and self._roles.get(index, POD) == role:
                        continue
                    self._detach_link(index)
                    self._roles.pop(index, None)
                if role is not None:
                    self._roles[index] = role
                    try:
                        self._attach_link(index, name)
                    except Exception as err:
                        if index not in self._attached:
                            self._roles.pop(index, None)
                        code = _err_code(err)
                        if code in (errno.ENODEV, errno.ENOENT):  # vanished meanwhile
                            continue
                        failures.append(f"{name}: {err}")
            self._prune_link_pins(links)
        if failures:
            how = ("TCX" if self.attach_mode == "tcx" else
                   f"tc priority {self.config.tc_priority}, handle {self.config.tc_handle:#x}")
            raise RuntimeFailure(f"cannot attach to {'; '.join(failures)} ({how})")
        return self.attached()

    def _attach_cgroup(self) -> tuple[str, ...]:
        """The cgroup hook's :meth:`attach`: both cgroup links on the cgroup v2 root;
        returns ``("cgroup:<root>",)``. Raises RuntimeFailure when the kernel refuses."""
        with self._lock:
            assert self._cgroup_root is not None
            if self._cgroup is None:
                self._cgroup = cgroup.CgroupLinks(self._cgroup_root, self.config.pin_path)
            self._cgroup.attach({name: fn.fd for name, fn in self._fns.items()})
            return self.attached()

    def detach(self) -> None:
        """Remove every TCX link and filter this datapath added (and clsact qdiscs it
        created, when empty); for the cgroup hook, its two cgroup links."""
        with self._lock:
            if self._cgroup is not None:
                self._cgroup.close(keep=False)
                self._cgroup = None
            for index in list(self._attached):
                try:
                    self._detach_link(index)
                except Exception as err:  # keep going: leave as little as possible behind
                    log.warning("cannot detach ifindex %d: %s", index, err)
                    self._attached.pop(index, None)
                self._roles.pop(index, None)

    def attached(self) -> tuple[str, ...]:
        """Names of the pod veths our programs are on; ``("cgroup:<root>",)`` for the
        cgroup hook once attached. Uplinks: :meth:`uplinks`."""
        with self._lock:
            if self._cgroup is not None and self._cgroup.fds:
                return (f"cgroup:{self._cgroup.root}",)
            return tuple(sorted(name for i, name in self._attached.items()
                                if self._roles.get(i, POD) == POD))

    def uplinks(self) -> tuple[str, ...]:
        """Names of the uplinks the first hop of node ports is counted on (``entry_hops``)."""
        with self._lock:
            return tuple(sorted(name for i, name in self._attached.items()
                                if self._roles.get(i) == UPLINK))

    # -- link events ----------------------------------------------------------------------

    def watch(self) -> None:
        """Start a thread that attaches to new pod veths within ~0.1 s of RTM_NEWLINK
        (the cgroup hook: attach now, there is nothing to follow).

        Each link event triggers a full :meth:`attach` scan (events only wake the thread,
        so a message coalesced in a socket buffer cannot be missed); a scan also runs
        every ``resync_seconds``. Stopped by :meth:`close`.

        The event socket is drained with plain ``recv`` calls and the messages are thrown
        away unparsed (:func:`_drain_events`): pyroute2 0.9's ``get()`` returns one
        datagram but queues every other datagram its event loop read meanwhile, and that
        queue was never emptied (about 2 KiB per pod veth created and deleted, measured
        with tracemalloc).
        """
        if self.hook == "cgroup" and self.uplink_mode is None:
            self.attach()  # the cgroup hook has no links to follow: attach, no thread
            return
        if self._watcher is not None:
            return
        ready = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, args=(ready,),
                                         name="zm-link-watch", daemon=True)
        self._watcher.start()
        ready.wait(5)

    def _watch_loop(self, ready: threading.Event) -> None:
        """Body of the link watcher thread (see :meth:`watch`); sets ``ready`` after the
        first scan. Returns when :meth:`close` stops it; logs and returns on any error."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.rtnl import RTMGRP_LINK

        events = IPRoute(netns=self.config.netns) if self.config.netns else IPRoute()
        try:
            events.bind(groups=RTMGRP_LINK)
            fd = events.fileno()
            try:
                self.attach()  # after bind: a link created before it is in this scan
            except RuntimeFailure as err:  # the other links are attached; retried later
                log.warning("%s", err)
            ready.set()
            last = time.monotonic()
            while not self._stop.is_set():
                readable, _, _ = select.select([fd], [], [], 0.1)
                if readable:
                    _drain_events(fd)
                elif time.monotonic() - last < self.config.resync_seconds:
                    continue
                last = time.monotonic()
                try:
                    self.attach()
                except RuntimeFailure as err:
                    log.warning("%s", err)
        except Exception as err:  # noqa: BLE001 - a dead watcher must be visible
            log.error("link watcher stopped: %s", err)
        finally:
            ready.set()
            events.close()
            ipr = getattr(self._local, "ipr", None)
            if ipr is not None:
                with self._lock:
                    self._sockets.remove(ipr)
                ipr.close()

    # -- endpoints and flows --------------------------------------------------------------

    def set_local_endpoints(self, endpoints: Iterable[tuple[IPAddress | str, int, int]]) -> None:
        """Replace the kernel's local endpoint set with ``endpoints``.

        Args:
            endpoints: ``(address, port, protocol)`` of each Service endpoint on this
                node: address as ipaddress object or string, port host order (converted
                to network order for the kernel), protocol number (6, 17, 132).

        Raises:
            InputError: an address, port or protocol is malformed, or there are more than
                ``endpoint_capacity`` endpoints (nothing is changed then).
        """
        with self._lock:
            service = self._service_ports
            self._endpoints = self._replace_set(
                endpoints, self._endpoints, self._endpoint_map,
                lambda port, on: self._write_port(port, on, port in service), "local endpoints")

    def set_entry_points(self, entries: Iterable[tuple[IPAddress | str, int, int]]) -> None:
        """Replace the kernel's entry set (``zm_entries``, bpf/uplink.h) with ``entries``:
        the addresses of this node where the first hop of a node port is counted.

        Args:
            entries: ``(address, port, protocol)``: a node address with a ``nodePort``, a
                LoadBalancer ingress IP or an externalIP with the Service port, of every
                Service with ``externalTrafficPolicy: Cluster``
                (:meth:`agent.k8s.ClusterMetadata.entry_points`); port host order,
                protocol number.

        Raises:
            InputError: an address, port or protocol is malformed, or there are more than
                ``endpoint_capacity`` entries (nothing is changed then).
        """
        with self._lock:
            self._entries = self._replace_set(entries, self._entries, self._entry_map,
                                              self._write_entry_port, "entry points")

    def _write_entry_port(self, port: int, on: bool) -> None:
        """Write the ``zm_entry_ports`` value of ``port`` (host order). Caller holds
        ``_lock``."""
        self._entry_ports[ctypes.c_int(port)] = ctypes.c_uint32(1 if on else 0)

    def _replace_set(self, items: Iterable[tuple[IPAddress | str, int, int]],
                     current: set[tuple[IPAddress, int, int]], table: Any,
                     write_port: Callable[[int, bool], None],
                     what: str) -> set[tuple[IPAddress, int, int]]:
        """Write ``items`` into a kernel map keyed by ``struct zm_endpoint_key`` and, through
        ``write_port(port, present)``, its port index (``zm_endpoints``/``zm_endpoint_ports``
        or ``zm_entries``/``zm_entry_ports``), by difference with ``current``; return the
        new set. Called under the lock.

        Raises:
            InputError: a malformed item, or more than ``endpoint_capacity`` of them.
        """
        wanted: set[tuple[IPAddress, int, int]] = set()
        for i, (addr, port, proto) in enumerate(items):
            try:
                ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
                endpoint_key(ip, int(port), int(proto))  # validates
            except ValueError as err:
                raise InputError(str(err), source=what, obj=f"entry {i}",
                                 field="address/port/protocol") from err
            wanted.add((ip, int(port), int(proto)))
        if len(wanted) > self.config.endpoint_capacity:
            raise InputError(f"{len(wanted)} {what} exceed endpoint_capacity "
                             f"{self.config.endpoint_capacity}", source=what)
        one = ctypes.c_uint32(1)
        old_ports = {port for _, port, _ in current}
        new_ports = {port for _, port, _ in wanted}
        # ports first when adding, keys first when removing: the port filter is never
        # narrower than the map
        for port in new_ports - old_ports:
            write_port(port, True)
        for ep in current - wanted:
            try:
                del table[endpoint_key(*ep)]
            except KeyError:
                pass
        for ep in wanted - current:
            table[endpoint_key(*ep)] = one
        for port in old_ports - new_ports:
            write_port(port, False)
        return wanted

    def set_service_ports(self, ports: Iterable[int]) -> None:
        """Replace the set of ports the kernel takes for possible server ports: every port
        some Service in the cluster uses (``spec.ports[].port``, numeric ``targetPort``,
        EndpointSlice ports), any protocol. A non-Service key keeps such a port on either
        side, inside the ephemeral range too, so attribution can recognise traffic to an
        endpoint the endpoint map lacks and a client's copy of traffic to an endpoint port
        inside the range (bits ``ZM_PORT_SERVICE`` of ``zm_endpoint_ports``;
        docs/datapath.md, "Late endpoints").

        Args:
            ports: port numbers, host order, 1..65535.

        Raises:
            InputError: a port is out of range (nothing is changed then).
        """
        wanted: set[int] = set()
        for port in ports:
            if not isinstance(port, int) or not 0 < port < 65536:
                raise InputError(f"port {port!r} is not in 1..65535", source="service ports")
            wanted.add(port)
        with self._lock:
            old = self._service_ports
            eps = {port for _, port, _ in self._endpoints}
            for port in wanted ^ old:
                self._write_port(port, port in eps, port in wanted)
            self._service_ports = frozenset(wanted)

    def _write_port(self, port: int, endpoint: bool, service: bool) -> None:
        """Write the ``zm_endpoint_ports`` value of ``port`` (host order). Caller holds
        ``_lock``."""
        value = (PORT_ENDPOINT if endpoint else 0) | (PORT_SERVICE if service else 0)
        self._endpoint_ports[ctypes.c_int(port)] = ctypes.c_uint32(value)

    def _read_counters(self) -> dict[int, tuple[str, int, int, int, int]]:
        """The ``IFLA_STATS64`` counters, now, of the interfaces the coverage check compares
        (one link dump): the attached veths, or for the cgroup hook the node's uplinks
        (:func:`select_uplinks`)."""
        out: dict[int, tuple[str, int, int, int, int]] = {}
        if self.hook == "cgroup":
            links = list(self._ipr().get_links())
            wanted = select_uplinks([_link_facts(link) for link in links],
                                    self.config.uplink_patterns, self._default_route_oifs)
        else:
            with self._lock:
                wanted = {i for i in self._attached if self._roles.get(i, POD) == POD}
            if not wanted:
                return out
            links = list(self._ipr().get_links())
        for link in links:
            index = link["index"]
            st = link.get_attr("IFLA_STATS64")
            if index in wanted and st is not None:
                out[index] = (link.get_attr("IFLA_IFNAME"), int(st["rx_bytes"]),
                              int(st["rx_packets"]), int(st["tx_bytes"]), int(st["tx_packets"]))
        return out

    def _default_route_oifs(self) -> set[int]:
        """Output devices of the default routes (IPv4 and IPv6, main table) in the node's
        namespace, multipath next hops included."""
        out: set[int] = set()
        ipr = self._ipr()
        for family in (socket.AF_INET, socket.AF_INET6):
            for route in ipr.get_routes(family=family, table=254):
                if route["dst_len"] != 0 or route.get_attr("RTA_DST") is not None:
                    continue
                oif = route.get_attr("RTA_OIF")
                if oif:
                    out.add(int(oif))
                for hop in route.get_attr("RTA_MULTIPATH") or ():
                    if hop.get("oif"):
                        out.add(int(hop["oif"]))
        return out

    def drain(self) -> list[FlowDelta]:
        """Return the flow deltas counted since the previous drain (see
        :mod:`agent.datapath.drain`). The attached interfaces' own counters are read
        just before the table switch, so :meth:`interface_bytes` covers the same interval."""
        now = self._read_counters()
        gained: dict[int, InterfaceBytes] = {}
        for index, (name, rxb, rxp, txb, txp) in now.items():
            old = self._if_counters.get(index)
            if old is not None and old[0] == name:
                gained[index] = InterfaceBytes(name, rxb - old[1], rxp - old[2],
                                               txb - old[3], txp - old[4])
        deltas = self.tables.drain()
        with self._lock:
            self._if_counters = now
            self._if_gained = gained
        return deltas

    def resume(self, handover: HandOver | None) -> None:
        """Hand-over mode of a checkpointing agent: from now on a drained side stays in
        the kernel until :meth:`commit`, and ``handover`` (the previous agent's, from its
        checkpoint; None: none) says whether the idle side is in its totals already
        (:meth:`FlowTables.resume`)."""
        self.tables.hold = True
        self.tables.resume(handover)

    def handover(self) -> HandOver:
        """The :class:`HandOver` to write into a checkpoint with the current totals."""
        return self.tables.handover()

    def commit(self) -> bool:
        """Empty the side the last drain read, once its totals are durable (True: there
        was one). Raises RuntimeFailure when the kernel refused (retried next time)."""
        return self.tables.commit()

    def interface_bytes(self) -> dict[int, InterfaceBytes]:
        """Return what each attached host-side veth (for the cgroup hook: each uplink of
        the node, :func:`select_uplinks`) carried between the two latest drains, by its
        own counters: ``{ifindex: InterfaceBytes}``. An interface attached (or become an
        uplink) since the previous drain is absent until the next one (its counters have
        no start inside the interval); so is one renamed or gone.

        For the coverage comparison: the bytes our programs counted on it in the same
        interval should be ``rx_bytes - 14 * rx_packets`` (ingress) and ``tx_bytes - 14 *
        tx_packets`` (egress), less non-IP frames, with offloads off (docs/datapath.md).
        """
        with self._lock:
            return dict(self._if_gained)

    def stats(self) -> DatapathStats:
        """Return :class:`DatapathStats` (attached interfaces, table entries and capacity)."""
        with self._lock:
            pods = tuple(sorted(name for i, name in self._attached.items()
                                if self._roles.get(i, POD) == POD))
            return DatapathStats(pods, self.tables.stats(), len(self._endpoints),
                                 self.attach_mode, self.uplinks(), len(self._entries))

    # -- lifecycle ------------------------------------------------------------------------

    def close(self, keep_attached: bool = False) -> None:
        """Stop the watcher, remove our filters, release netlink sockets. Idempotent.

        Pins always stay (what was counted after the last drain is then drained by the
        next agent); :meth:`cleanup` removes them.

        Args:
            keep_attached: with ``pin_path`` set, leave the filters and the pins in place
                so the kernel keeps counting for the next agent (see :meth:`release`).
                Ignored without pinning: filters whose maps nobody can reach any more
                would count for nothing, so they are removed.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)
        if keep_attached and self.config.pin_path:
            log.info("leaving %d interfaces attached, maps pinned in %s",
                     len(self._attached), self.config.pin_path)
            with self._lock:
                for fds in self._links.values():  # the pins hold the links
                    for fd in fds:
                        os.close(fd)
                self._links.clear()
                if self._cgroup is not None:
                    self._cgroup.close(keep=True)
        else:
            self.detach()
        if self._pin_lock is not None:
            os.close(self._pin_lock)  # the next agent may take over the pins
            self._pin_lock = None
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001
                    pass
            self._sockets.clear()
        self._local = threading.local()

    def release(self) -> None:
        """Hand over to the next agent: like :meth:`close`, but with ``pin_path`` set the
        filters and pins stay, so the kernel keeps counting until a restarted agent
        reuses them (a rolling update loses nothing). Without pinning this is
        :meth:`close`: the filters are removed. For SIGTERM in the agent."""
        self.close(keep_attached=True)

    @classmethod
    def cleanup(cls, pin_path: str | None, netns: str | None = None, *,
                tc_priority: int = DEFAULT_TC_PRIORITY,
                tc_handle: int = DEFAULT_TC_HANDLE) -> CleanupResult:
        """Remove what released agents left: our tc filters in netns, the pinned TCX
        links (unlinking the last pin detaches a link) and the map pins.

        A filter is ours when it is a bpf filter with our priority and handle whose
        program name starts with ``zm_tc_``; others are never touched. Clsact qdiscs are
        left in place (a CNI may own them). Needs no BCC and no running datapath; TCX
        links of an agent still running stay until it exits (its fds hold them).

        Args:
            pin_path: the directory given as ``DatapathConfig.pin_path``, or None.
            netns: network namespace name (``/run/netns``), None for ours.
            tc_priority, tc_handle: as in :class:`DatapathConfig`.

        Returns:
            :class:`CleanupResult` naming what was removed.

        Raises:
            InputError: pin_path is malformed.
            RuntimeFailure: a pin or filter could not be removed.
        """
        from pyroute2 import IPRoute

        removed: list[tuple[str, str]] = []
        with (IPRoute(netns=netns) if netns else IPRoute()) as ipr:
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME")
                try:
                    sides = _delete_our_filters(ipr, link["index"], tc_priority, tc_handle)
                except Exception as err:
                    raise RuntimeFailure(f"cannot remove our filter from {name}: {err}") from err
                removed.extend((name, side) for side in sides)
        pins: list[str] = []
        links: list[str] = []
        if pin_path is not None:
            check_pin_path(pin_path)
            if os.path.exists(pin_path) and not on_bpf_fs(pin_path):
                raise InputError(f"{pin_path} is not on a BPF filesystem: nothing of ours there",
                                 source="datapath", field="pin_path")
            if os.path.isdir(pin_path):
                links.extend(cgroup.cleanup_pins(pin_path))
            for pin in sorted(os.listdir(pin_path)) if os.path.isdir(pin_path) else ():
                if _link_pin_ifindex(pin) is None:
                    continue
                try:
                    fd = tcx.obj_get(os.path.join(pin_path, pin))
                except OSError:
                    pass
                else:
                    _detach_and_close(fd)
                try:
                    os.unlink(os.path.join(pin_path, pin))
                    links.append(pin)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    raise RuntimeFailure(f"cannot remove link pin {pin_path}/{pin}: {err}") from err
            for pin in PINNED_MAPS:
                try:
                    os.unlink(os.path.join(pin_path, pin))
                    pins.append(pin)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    raise RuntimeFailure(f"cannot remove pin {pin_path}/{pin}: {err}") from err
            try:
                os.rmdir(pin_path)
            except OSError:
                pass  # not empty (not ours to remove) or already gone
        return CleanupResult(tuple(removed), tuple(pins), tuple(links))

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
