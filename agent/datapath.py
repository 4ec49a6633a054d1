"""Load the zonemeter BPF programs with BCC and attach them to pod veths with pyroute2.

One :class:`Datapath` per node: it compiles ``bpf/tc.c`` once (BCC, ``-D`` options from
:class:`DatapathConfig`), attaches ``zm_tc_from_pod`` to clsact ingress and
``zm_tc_to_pod`` to clsact egress of every pod veth (host side) in the node's network
namespace, follows links appearing and disappearing (RTM_NEWLINK/RTM_DELLINK), writes the
node's local Service endpoints into the kernel, and hands out :class:`FlowDelta` records
(:meth:`Datapath.drain`). BCC and pyroute2 objects never leave this module and
:mod:`agent.flows`.

Restart without loss: with ``DatapathConfig.pin_path`` every map is pinned on a BPF
filesystem. The kernel keeps counting while no agent runs; a restarted agent reuses the
pins, atomically replaces its tc filters (same priority and handle: never a second
attachment, never a gap) and drains what accumulated. :meth:`Datapath.release` leaves
filters and pins in place for the next agent; :meth:`Datapath.cleanup` removes both.

Debug entry point (prints the effective C and cflags, or attaches and prints deltas)::

    python -m agent.datapath --print-c
    python -m agent.datapath --netns zm1a2b-node-a --interval 2
    python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zonemeter/node-a
    python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zonemeter/node-a --cleanup
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import fnmatch
import ipaddress
import json
import logging
import os
import platform
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.bpf_types import (
    CACHE_SLOTS,
    LAYOUT_VERSION,
    OVERFLOW_SLOTS,
    CacheSlot,
    EndpointKey,
    FlowKey,
    FlowValue,
    addr_from_bytes,
    endpoint_key,
)
from agent.errors import InputError, RuntimeFailure
from agent.flows import FlowTables, MapInfo, TableStats, map_info
from agent.records import FlowDelta, IPAddress

log = logging.getLogger(__name__)

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
TC_SOURCE = BPF_DIR / "tc.c"

#: clsact parents: TC_H_CLSACT | TC_H_MIN_INGRESS / TC_H_MIN_EGRESS
PARENT_INGRESS = 0xFFFFFFF2
PARENT_EGRESS = 0xFFFFFFF3
ETH_P_ALL = 0x0003
_PROGRAMS = ((PARENT_INGRESS, "zm_tc_from_pod"), (PARENT_EGRESS, "zm_tc_to_pod"))

DEFAULT_EPHEMERAL = (32768, 60999)  # Linux default net.ipv4.ip_local_port_range

BPF_FS_MAGIC = 0xCAFE4A11
_PIN_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")
_MAP_HASH, _MAP_ARRAY, _MAP_PERCPU_ARRAY, _MAP_ARRAY_OF_MAPS = 1, 2, 6, 12
#: every map bpf/maps.h pins under pin_path (file name = map name)
PINNED_MAPS = ("zm_flows_a", "zm_flows_b", "zm_active", "zm_cache_a", "zm_cache_b",
               "zm_cache_active", "zm_endpoints", "zm_endpoint_ports", "zm_lost", "zm_layout")
_TC_NAME_PREFIX = "zm_tc_"
DEFAULT_TC_PRIORITY = 1
DEFAULT_TC_HANDLE = 0x7A6D  # "zm"


@dataclass(frozen=True, slots=True)
class DatapathConfig:
    """Settings of one node's datapath.

    Attributes:
        netns: name of the network namespace (``/run/netns/NAME``) whose pod veths are
            attached; None for the agent's own namespace (a real node).
        hook: ``"tc"`` (clsact on host-side pod veths). ``"cgroup_skb"`` is reserved for
            data planes that bypass the veth (see DESIGN.md) and not implemented yet.
        interface_patterns: extra fnmatch patterns (``"cali*"``, ``"lxc*"``): a link whose
            name matches is attached whatever its kind.
        require_peer_netns: the default rule: attach every veth whose peer lives in another
            network namespace (the host side of a pod veth).
        exclude_patterns: fnmatch patterns of links never attached (uplinks that happen to
            be veths with a peer elsewhere, as in a lab).
        flow_capacity: flow entries per table (two tables); beyond it bytes go to the
            per-(kind, family) overflow entries, see docs/datapath.md.
        endpoint_capacity: local endpoints the kernel map holds.
        ephemeral_ports: inclusive (low, high) range, host order; a remote port inside it is
            recorded as 0 for non-Service flows. None: read the namespace's
            ``net.ipv4.ip_local_port_range``.
        tc_priority: tc filter priority (lower runs first); 1, so our filter runs before
            CNI filters at higher numbers; we return TC_ACT_UNSPEC so later filters run.
        tc_handle: tc filter handle identifying our filters (replace on restart, delete on exit).
        resync_seconds: full re-scan of links at this period besides netlink events.
        pin_path: directory on a BPF filesystem (``/sys/fs/bpf/zonemeter/<node>``) where
            every map is pinned so counting survives agent restarts; None: no pinning,
            maps die with the agent. Only ``[A-Za-z0-9._/-]``, absolute, no ``..``.
            Pins with another layout (older version, other capacities) are recreated,
            see docs/datapath.md.
        pin_lock_seconds: how long a new agent waits for the agent still holding
            pin_path (a DaemonSet rolling update with surge runs both for a moment) before
            giving up with RuntimeFailure. Two agents draining the same pinned tables
            would corrupt each other's table switching, so they never share them.
    """

    netns: str | None = None
    hook: str = "tc"
    interface_patterns: tuple[str, ...] = ()
    require_peer_netns: bool = True
    exclude_patterns: tuple[str, ...] = ()
    flow_capacity: int = 65536
    endpoint_capacity: int = 16384
    ephemeral_ports: tuple[int, int] | None = None
    tc_priority: int = DEFAULT_TC_PRIORITY
    tc_handle: int = DEFAULT_TC_HANDLE
    resync_seconds: float = 10.0
    pin_path: str | None = None
    pin_lock_seconds: float = 60.0

    def validate(self) -> None:
        """Raises InputError naming the field when a setting is out of range."""
        if self.hook != "tc":
            raise InputError(f"hook {self.hook!r} is not supported (supported: tc)",
                             source="datapath", field="hook")
        # every number below becomes a -D flag of the BPF compile: only true ints may pass
        ints = {"flow_capacity": self.flow_capacity, "endpoint_capacity": self.endpoint_capacity,
                "tc_priority": self.tc_priority, "tc_handle": self.tc_handle}
        if self.ephemeral_ports is not None:
            ints.update(ephemeral_ports_low=self.ephemeral_ports[0],
                        ephemeral_ports_high=self.ephemeral_ports[1])
        for name, value in ints.items():
            if type(value) is not int:
                raise InputError(f"must be an integer, got {value!r}", source="datapath", field=name)
        if not 8 <= self.flow_capacity <= 16_777_216:
            raise InputError("must be within 8..16777216", source="datapath", field="flow_capacity")
        if not 1 <= self.endpoint_capacity <= 1_048_576:
            raise InputError("must be within 1..1048576", source="datapath", field="endpoint_capacity")
        if self.ephemeral_ports is not None:
            lo, hi = self.ephemeral_ports
            if not 1 <= lo <= hi <= 65535:
                raise InputError(f"{lo}-{hi} is no port range", source="datapath",
                                 field="ephemeral_ports")
        if not 1 <= self.tc_priority <= 0xFFFF:
            raise InputError("must be within 1..65535", source="datapath", field="tc_priority")
        if not 1 <= self.tc_handle <= 0xFFFFFFFF:
            raise InputError("must be a non-zero u32", source="datapath", field="tc_handle")
        if not 0 <= self.pin_lock_seconds <= 3600:
            raise InputError("must be within 0..3600", source="datapath", field="pin_lock_seconds")
        if self.pin_path is not None:
            check_pin_path(self.pin_path)


def check_pin_path(path: str) -> None:
    """Raise InputError (field ``pin_path``) unless path is an absolute path made of
    ``[A-Za-z0-9._/-]`` without ``..`` (it becomes a C string literal in the cflags)."""
    if not _PIN_PATH_RE.match(path) or ".." in path.split("/"):
        raise InputError(f"{path!r} must be an absolute path of [A-Za-z0-9._/-] without '..'",
                         source="datapath", field="pin_path")


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """What :meth:`Datapath.cleanup` removed.

    Attributes:
        filters: ``(interface name, "ingress" | "egress")`` of each filter of ours deleted.
        pins: names of the pinned maps unlinked (see :data:`PINNED_MAPS`).
    """

    filters: tuple[tuple[str, str], ...]
    pins: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DatapathStats:
    """Self-health of one datapath (feeds ``zonemeter_flow_table_*`` and
    ``zonemeter_attached_interfaces``).

    Attributes:
        attached: host-side interface names our filters are on.
        table: flow table health (:class:`agent.flows.TableStats`).
        endpoints: local endpoints currently written to the kernel.
    """

    attached: tuple[str, ...]
    table: TableStats
    endpoints: int


def run_in_netns(netns: str | None, fn):  # type: ignore[no-untyped-def]
    """Return fn() run in a thread that entered network namespace netns (a name under
    /run/netns), or fn() itself when netns is None. setns moves only the calling thread,
    so the caller's namespace never changes. Exceptions of fn propagate."""
    if netns is None:
        return fn()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            from pyroute2.netns import setns

            setns(netns, flags=0)
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            box["error"] = err

    th = threading.Thread(target=target, name=f"zm-netns-{netns}")
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def read_ephemeral_range(netns: str | None) -> tuple[int, int]:
    """Return ``net.ipv4.ip_local_port_range`` of netns as (low, high), host order.

    Falls back to Linux's default (32768, 60999) when the file cannot be read.
    """
    def read() -> tuple[int, int]:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = (int(x) for x in text.split())
        return lo, hi

    try:
        return run_in_netns(netns, read)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


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
    return getattr(err, "code", None)


# -- pinning -----------------------------------------------------------------------------

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_OBJ_GET = 7
_libc = ctypes.CDLL(None, use_errno=True)


def _statfs_type(path: str) -> int:
    """f_type of the filesystem holding path (statfs(2)); raises OSError."""
    buf = (ctypes.c_uint8 * 256)()
    if _libc.statfs(path.encode(), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int.from_bytes(bytes(buf[:8]), sys.byteorder, signed=True) & 0xFFFFFFFF


def on_bpf_fs(path: str) -> bool:
    """Whether path, or its nearest existing parent, is on a BPF filesystem (bpffs)."""
    cur = Path(path)
    while not cur.exists():
        cur = cur.parent
    return _statfs_type(str(cur)) == BPF_FS_MAGIC


def obj_get(path: str) -> int:
    """Return a new fd of the BPF object pinned at path (``BPF_OBJ_GET``); caller closes it.

    Raises:
        OSError: nothing pinned there, or the kernel refused.
    """
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:  # pragma: no cover - other architectures
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown on {platform.machine()}")
    raw = ctypes.create_string_buffer(path.encode())
    attr = (ctypes.c_uint64 * 3)(ctypes.addressof(raw), 0, 0)  # pathname, bpf_fd, file_flags
    fd = _libc.syscall(nr, _BPF_OBJ_GET, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def expected_maps(config: DatapathConfig) -> dict[str, tuple[int, int, int, int]]:
    """Return {map name: (BPF_MAP_TYPE_*, key bytes, value bytes, max_entries)} of every
    pinned map as this agent's bpf/maps.h defines it with ``config``."""
    flow = (_MAP_HASH, ctypes.sizeof(FlowKey), ctypes.sizeof(FlowValue),
            config.flow_capacity + OVERFLOW_SLOTS)
    return {
        "zm_flows_a": flow,
        "zm_flows_b": flow,
        "zm_active": (_MAP_ARRAY_OF_MAPS, 4, 4, 1),
        "zm_cache_a": (_MAP_PERCPU_ARRAY, 4, ctypes.sizeof(CacheSlot), CACHE_SLOTS),
        "zm_cache_b": (_MAP_PERCPU_ARRAY, 4, ctypes.sizeof(CacheSlot), CACHE_SLOTS),
        "zm_cache_active": (_MAP_ARRAY_OF_MAPS, 4, 4, 1),
        "zm_endpoints": (_MAP_HASH, ctypes.sizeof(EndpointKey), 4, config.endpoint_capacity),
        "zm_endpoint_ports": (_MAP_ARRAY, 4, 4, 65536),
        "zm_lost": (_MAP_ARRAY, 4, ctypes.sizeof(FlowValue), 1),
        "zm_layout": (_MAP_ARRAY, 4, 4, 1),
    }


def _pin_mismatches(config: DatapathConfig) -> list[str]:
    """Why the pins under config.pin_path cannot be reused (empty list: they can)."""
    assert config.pin_path is not None
    problems = []
    for name, want in expected_maps(config).items():
        path = os.path.join(config.pin_path, name)
        if not os.path.exists(path):
            problems.append(f"{name} missing")
            continue
        try:
            fd = obj_get(path)
        except OSError as err:
            problems.append(f"{name}: {err.strerror}")
            continue
        try:
            info: MapInfo = map_info(fd)
            got = (info.type, info.key_size, info.value_size, info.max_entries)
            if got != want:
                problems.append(f"{name} is (type, key, value, entries) {got}, expected {want}")
            elif name == "zm_layout":
                from bcc.libbcc import lib

                zero, version = ctypes.c_int(0), ctypes.c_uint32(0)
                lib.bpf_lookup_elem(fd, ctypes.byref(zero), ctypes.byref(version))
                if version.value != LAYOUT_VERSION:
                    problems.append(f"layout version {version.value}, expected {LAYOUT_VERSION}")
        finally:
            os.close(fd)
    return problems


def make_pin_dir(path: str) -> None:
    """Create the pin directory path (and parents) on a BPF filesystem.

    Raises:
        InputError: path is not on a BPF filesystem.
        RuntimeFailure: the directory cannot be created.
    """
    try:
        if not on_bpf_fs(path):
            raise InputError(f"{path} is not on a BPF filesystem (mount -t bpf bpf /sys/fs/bpf)",
                             source="datapath", field="pin_path")
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise RuntimeFailure(f"cannot create pin directory {path}: {err}") from err


def lock_pins(path: str, timeout: float) -> int:
    """Take an exclusive flock on the pin directory path; return its fd (closing it
    releases the lock, as does the process's death, even by SIGKILL).

    Raises:
        RuntimeFailure: another process held the lock for ``timeout`` seconds.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RuntimeFailure(
                    f"another agent still uses the pinned maps in {path} "
                    f"(waited {timeout:g} s for it to exit)") from None
            time.sleep(0.1)


def prepare_pins(config: DatapathConfig) -> bool:
    """Make config.pin_path ready for BCC; return True when a previous agent's pins are
    reused (the kernel kept counting into them), False when BCC will create fresh ones.

    Pins that do not match this agent's layout (another ``ZM_LAYOUT_VERSION``, other
    struct sizes or capacities, a partial set) are unlinked and recreated, with one
    warning: the counts they held since the previous agent's last drain cannot be read
    with this layout and are dropped. Refusing would leave the node uncounted until
    someone removed the pins by hand.

    Raises:
        InputError: pin_path is not on a BPF filesystem.
        RuntimeFailure: the directory cannot be created or a stale pin removed.
    """
    assert config.pin_path is not None
    path = config.pin_path
    make_pin_dir(path)
    present = [n for n in PINNED_MAPS if os.path.exists(os.path.join(path, n))]
    if not present:
        return False
    problems = _pin_mismatches(config)
    if not problems:
        return True
    log.warning("pinned maps in %s do not fit this agent (%s): recreating them; counts "
                "held there since the previous agent's last drain are dropped",
                path, "; ".join(problems))
    for name in present:
        try:
            os.unlink(os.path.join(path, name))
        except OSError as err:
            raise RuntimeFailure(f"cannot remove stale pin {path}/{name}: {err}") from err
    return False


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
        self._attached: dict[int, str] = {}  # ifindex -> name
        self._created_qdisc: set[int] = set()
        self._endpoints: set[tuple[IPAddress, int, int]] = set()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._closed = False
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
            try:
                self._bpf = BPF(src_file=str(TC_SOURCE).encode(), cflags=self.cflags())
                self._fns = {name: self._bpf.load_func(name.encode(), BPF.SCHED_CLS)
                             for _, name in _PROGRAMS}
            except Exception as err:
                raise RuntimeFailure(f"cannot load {TC_SOURCE}: {err}") from err
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
                    b[b"zm_cache_active"].get_fd()))
        self._endpoint_map = b[b"zm_endpoints"]
        self._endpoint_ports = b[b"zm_endpoint_ports"]
        if self.reused:
            # the previous agent's endpoints keep classifying until set_local_endpoints
            self._endpoints = self._kernel_endpoints()
        elif self.config.pin_path:
            b[b"zm_layout"][ctypes.c_int(0)] = ctypes.c_uint32(LAYOUT_VERSION)
        if self.reused:
            log.info("reusing pinned maps in %s", self.config.pin_path)

    def _kernel_endpoints(self) -> set[tuple[IPAddress, int, int]]:
        """The endpoint set held by the (pinned) kernel map, as set_local_endpoints keeps it."""
        out: set[tuple[IPAddress, int, int]] = set()
        for key in self._endpoint_map.keys():
            raw = bytes(key.addr)
            family = 4 if raw[:12] == b"\x00" * 10 + b"\xff\xff" else 6
            out.add((addr_from_bytes(raw, family), socket.ntohs(key.port), int(key.proto)))
        return out

    # -- compile ----------------------------------------------------------------------

    def cflags(self) -> list[str]:
        """Return the BCC cflags (``-I``, ``-D`` options) the programs are compiled with."""
        return flags_for(self.config, self._ephemeral)

    # -- netlink helpers ----------------------------------------------------------------

    def _ipr(self):  # type: ignore[no-untyped-def]
        """This thread's IPRoute socket in the node namespace."""
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            from pyroute2 import IPRoute

            ipr = IPRoute(netns=self.config.netns) if self.config.netns else IPRoute()
            self._local.ipr = ipr
            with self._lock:
                self._sockets.append(ipr)
        return ipr

    def _wanted(self, link) -> bool:  # type: ignore[no-untyped-def]
        """Whether a link (RTM_NEWLINK message) is a pod veth we should attach."""
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

    def _attach_link(self, index: int, name: str) -> None:
        ipr = self._ipr()
        try:
            ipr.tc("add", "clsact", index)
            self._created_qdisc.add(index)
        except Exception as err:  # NetlinkError
            if _nl_code(err) != errno.EEXIST:
                raise
        try:
            for parent, prog in _PROGRAMS:
                fn = self._fns[prog]
                # replace: a filter left by a previous run of ours (same prio and handle)
                # is swapped for this one instead of running twice; others are untouched
                ipr.tc("replace-filter", "bpf", index, self.config.tc_handle, fd=fn.fd,
                       name=prog, parent=parent, classid=1, direct_action=True,
                       prio=self.config.tc_priority, protocol=ETH_P_ALL)
        except Exception:
            self._attached[index] = name
            try:  # never leave half an attachment behind (ingress without egress)
                self._detach_link(index)
            except Exception as err:  # noqa: BLE001 - the original error matters more
                log.warning("cannot roll back %s: %s", name, err)
            raise
        self._attached[index] = name
        log.info("attached to %s (ifindex %d)", name, index)

    def _detach_link(self, index: int) -> None:
        ipr = self._ipr()
        for parent, _ in _PROGRAMS:
            try:
                ipr.tc("del-filter", "bpf", index, self.config.tc_handle, parent=parent,
                       prio=self.config.tc_priority, protocol=ETH_P_ALL)
            except Exception as err:
                if _nl_code(err) not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                    raise
        if index in self._created_qdisc:
            self._created_qdisc.discard(index)
            try:
                left = [f for parent, _ in _PROGRAMS
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
        crashed previous run is replaced, never duplicated.

        Returns:
            names of the interfaces attached after the scan.

        Raises:
            RuntimeFailure: some wanted link could not be attached (the others still are;
                the message names each failed link). A refusal at our priority usually
                means another filter kind or protocol holds it: set ``tc_priority``.
        """
        failures: list[str] = []
        with self._lock:
            links = {l["index"]: l for l in self._ipr().get_links()}
            for index in list(self._attached):
                if index not in links:
                    self._attached.pop(index, None)
                    self._created_qdisc.discard(index)
            for index, link in links.items():
                name = link.get_attr("IFLA_IFNAME")
                if index in self._attached:
                    if self._attached[index] == name and self._wanted(link):
                        continue
                    self._detach_link(index)
                if self._wanted(link):
                    try:
                        self._attach_link(index, name)
                    except Exception as err:
                        code = _nl_code(err)
                        if code in (errno.ENODEV, errno.ENOENT):  # vanished meanwhile
                            continue
                        failures.append(f"{name}: {err}")
            attached = tuple(sorted(self._attached.values()))
        if failures:
            raise RuntimeFailure(
                f"cannot attach to {'; '.join(failures)} (tc priority "
                f"{self.config.tc_priority}, handle {self.config.tc_handle:#x})")
        return attached

    def detach(self) -> None:
        """Remove every filter this datapath added (and clsact qdiscs it created, when empty)."""
        with self._lock:
            for index in list(self._attached):
                try:
                    self._detach_link(index)
                except Exception as err:  # keep going: leave as little as possible behind
                    log.warning("cannot detach ifindex %d: %s", index, err)
                    self._attached.pop(index, None)

    def attached(self) -> tuple[str, ...]:
        """Names of the interfaces our filters are on."""
        with self._lock:
            return tuple(sorted(self._attached.values()))

    # -- link events ----------------------------------------------------------------------

    def watch(self) -> None:
        """Start a thread that attaches to new pod veths within ~0.1 s of RTM_NEWLINK.

        Each link event triggers a full :meth:`attach` scan (events only wake the thread,
        so a message coalesced in a socket buffer cannot be missed); a scan also runs
        every ``resync_seconds``. Stopped by :meth:`close`.

        The event socket is drained with plain ``recv`` calls and the messages are thrown
        away unparsed (:func:`_drain_events`): pyroute2 0.9's ``get()`` returns one
        datagram but queues every other datagram its event loop read meanwhile, and that
        queue was never emptied (about 2 KiB per pod veth created and deleted, measured
        with tracemalloc).
        """
        if self._watcher is not None:
            return
        ready = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, args=(ready,),
                                         name="zm-link-watch", daemon=True)
        self._watcher.start()
        ready.wait(5)

    def _watch_loop(self, ready: threading.Event) -> None:
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
        wanted: set[tuple[IPAddress, int, int]] = set()
        for i, (addr, port, proto) in enumerate(endpoints):
            try:
                ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
                endpoint_key(ip, int(port), int(proto))  # validates
            except ValueError as err:
                raise InputError(str(err), source="local endpoints", obj=f"endpoint {i}",
                                 field="address/port/protocol") from err
            wanted.add((ip, int(port), int(proto)))
        if len(wanted) > self.config.endpoint_capacity:
            raise InputError(f"{len(wanted)} endpoints exceed endpoint_capacity "
                             f"{self.config.endpoint_capacity}", source="local endpoints")
        one = ctypes.c_uint32(1)
        with self._lock:
            old_ports = {port for _, port, _ in self._endpoints}
            new_ports = {port for _, port, _ in wanted}
            # ports first when adding, endpoints first when removing: the port filter is
            # never narrower than the endpoint map
            for port in new_ports - old_ports:
                self._endpoint_ports[ctypes.c_int(port)] = one
            for ep in self._endpoints - wanted:
                try:
                    del self._endpoint_map[endpoint_key(*ep)]
                except KeyError:
                    pass
            for ep in wanted - self._endpoints:
                self._endpoint_map[endpoint_key(*ep)] = one
            for port in old_ports - new_ports:
                self._endpoint_ports[ctypes.c_int(port)] = ctypes.c_uint32(0)
            self._endpoints = wanted

    def drain(self) -> list[FlowDelta]:
        """Return the flow deltas counted since the previous drain (see :mod:`agent.flows`)."""
        return self.tables.drain()

    def stats(self) -> DatapathStats:
        """Return :class:`DatapathStats` (attached interfaces, table entries and capacity)."""
        with self._lock:
            return DatapathStats(tuple(sorted(self._attached.values())), self.tables.stats(),
                                 len(self._endpoints))

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
        """Remove what released agents left: our tc filters in netns and the pins.

        A filter is ours when it is a bpf filter with our priority and handle whose
        program name starts with ``zm_tc_``; others are never touched. Clsact qdiscs are
        left in place (a CNI may own them). Needs no BCC and no running datapath.

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
                for parent, side in ((PARENT_INGRESS, "ingress"), (PARENT_EGRESS, "egress")):
                    try:
                        filters = ipr.get_filters(index=link["index"], parent=parent)
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
                        ipr.tc("del-filter", "bpf", link["index"], tc_handle, parent=parent,
                               prio=tc_priority, protocol=ETH_P_ALL)
                    except Exception as err:
                        if _nl_code(err) not in (errno.ENOENT, errno.ENODEV):
                            raise RuntimeFailure(f"cannot remove our filter from {name}: {err}") from err
                        continue
                    removed.append((name, side))
        pins: list[str] = []
        if pin_path is not None:
            check_pin_path(pin_path)
            if os.path.exists(pin_path) and not on_bpf_fs(pin_path):
                raise InputError(f"{pin_path} is not on a BPF filesystem: nothing of ours there",
                                 source="datapath", field="pin_path")
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
        return CleanupResult(tuple(removed), tuple(pins))

    def __enter__(self) -> "Datapath":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def flags_for(config: DatapathConfig, ephemeral: tuple[int, int]) -> list[str]:
    """Return the cflags for ``config`` with the ephemeral range (low, high) in host order.

    ``pin_path`` becomes ``-DZM_PIN_DIR="<path>"`` (validated: no quotes can reach the C).
    """
    flags = [
        f"-I{BPF_DIR}",
        f"-DZM_FLOW_CAPACITY={config.flow_capacity}",
        f"-DZM_ENDPOINT_CAPACITY={config.endpoint_capacity}",
        f"-DZM_EPHEMERAL_MIN={ephemeral[0]}",
        f"-DZM_EPHEMERAL_MAX={ephemeral[1]}",
    ]
    if config.pin_path is not None:
        check_pin_path(config.pin_path)
        flags.append(f'-DZM_PIN_DIR="{config.pin_path.rstrip("/") or "/"}"')
    return flags


def effective_source() -> str:
    """Return the C the programs are built from: tc.c with its local headers inlined."""
    parts = []
    for name in ("zonemeter.h", "maps.h", "parse.h", "account.h", "classify.h", "tc.c"):
        parts.append(f"/* ---- bpf/{name} ---- */\n" + (BPF_DIR / name).read_text())
    return "\n".join(parts)


def _delta_json(d: FlowDelta) -> str:
    return json.dumps({"kind": d.kind.value, "local": str(d.local), "remote": str(d.remote),
                       "port": d.port, "protocol": d.protocol, "bytes": d.bytes,
                       "packets": d.packets, "overflow": d.overflow})


def main(argv: list[str] | None = None) -> int:
    """Debug entry point: print the C, or attach, and print drained deltas as JSON lines.

    Exits 0 on SIGTERM/SIGINT after removing every filter it added, or with
    ``--pin-path`` after leaving filters and pins for the next run (``--cleanup`` removes
    them). Each drain prints one JSON line per delta, then ``{"drained": N}``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m agent.datapath",
        description="Attach the zonemeter datapath to pod veths and print flow deltas.",
        epilog="examples:\n  python -m agent.datapath --print-c\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --interval 1\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zm/a\n"
               "  python -m agent.datapath --netns zm1a2b-node-a --pin-path /sys/fs/bpf/zm/a --cleanup",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--netns", help="network namespace of the node (default: ours)")
    parser.add_argument("--interval", type=float, default=5.0, help="drain period, seconds")
    parser.add_argument("--capacity", type=int, default=65536, help="flow entries per table")
    parser.add_argument("--interface", action="append", default=[],
                        help="extra interface name pattern to attach (fnmatch)")
    parser.add_argument("--exclude", action="append", default=[],
                        help="interface name pattern never attached (fnmatch)")
    parser.add_argument("--endpoint", action="append", default=[],
                        help="local endpoint ADDRESS,PORT,PROTO (proto number)")
    parser.add_argument("--pin-path",
                        help="pin the maps in this directory on a BPF filesystem "
                             "(e.g. /sys/fs/bpf/zonemeter/NODE): SIGTERM then leaves the "
                             "filters counting for the next run, which reuses the pins")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove our filters (in --netns) and the pins (--pin-path), then exit")
    parser.add_argument("--print-c", action="store_true",
                        help="print the effective BPF C and cflags, then exit")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except InputError as err:
        print(f"python -m agent.datapath: error: {err}", file=sys.stderr)
        return 2
    except RuntimeFailure as err:
        print(f"python -m agent.datapath: error: {err}", file=sys.stderr)
        return 1


def _parse_endpoint(text: str) -> tuple[str, int, int]:
    """Parse ``ADDRESS,PORT,PROTO``; raises InputError naming the flag."""
    try:
        addr, port, proto = text.split(",")
        ipaddress.ip_address(addr)
        return addr, int(port), int(proto)
    except ValueError:
        raise InputError(f"{text!r} is not ADDRESS,PORT,PROTO (e.g. 10.1.0.5,8080,6)",
                         source="--endpoint") from None


def _main(args: argparse.Namespace) -> int:
    config = DatapathConfig(netns=args.netns, flow_capacity=args.capacity,
                            interface_patterns=tuple(args.interface),
                            exclude_patterns=tuple(args.exclude), pin_path=args.pin_path)
    config.validate()
    eps = [_parse_endpoint(text) for text in args.endpoint]
    if args.cleanup:
        res = Datapath.cleanup(config.pin_path, config.netns, tc_priority=config.tc_priority,
                               tc_handle=config.tc_handle)
        print(json.dumps({"removed_filters": [list(f) for f in res.filters],
                          "removed_pins": list(res.pins)}), flush=True)
        return 0
    if args.print_c:
        eph = config.ephemeral_ports or read_ephemeral_range(config.netns)
        print("/* cflags: " + " ".join(flags_for(config, eph)) + " */")
        print(effective_source())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    dp = Datapath(config)
    try:
        dp.set_local_endpoints(eps)
        dp.watch()
        print(json.dumps({"attached": list(dp.attached()), "reused": dp.reused}), flush=True)
        while True:
            stopping = stop.wait(args.interval)
            deltas = dp.drain()  # a last one on exit: nothing counted so far is lost
            for d in deltas:
                print(_delta_json(d), flush=True)
            print(json.dumps({"drained": len(deltas)}), flush=True)  # end of one drain
            if stopping:
                break
    finally:
        # with pins, leave the filters counting for the next run (rolling update)
        dp.release()
    print(json.dumps({"detached": config.pin_path is None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
