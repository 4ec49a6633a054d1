"""Settings of one node's datapath and the BCC compile flags they become.

:class:`DatapathConfig` is validated before anything reaches the C compiler: every
number becomes a ``-D`` option of ``bpf/tc.c`` (documented in ``bpf/zonemeter.h``) and
the pin path a C string literal (:func:`flags_for`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.errors import InputError, RuntimeFailure

#: the C sources: ``bpf/`` next to the ``agent`` package
BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
#: the program file BCC compiles for the veth hook (it includes the other headers of BPF_DIR)
TC_SOURCE = BPF_DIR / "tc.c"
#: the program file BCC compiles for the cgroup hook
CGROUP_SOURCE = BPF_DIR / "cgroup.c"

DEFAULT_EPHEMERAL = (32768, 60999)  # Linux default net.ipv4.ip_local_port_range
DEFAULT_TC_PRIORITY = 1
DEFAULT_TC_HANDLE = 0x7A6D  # "zm"
#: values of DatapathConfig.attach
ATTACH_MODES = ("auto", "tcx", "clsact")
#: values of DatapathConfig.hook
HOOKS = ("veth", "cgroup", "auto")
_NETNS_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_PIN_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")


@dataclass(frozen=True, slots=True)
class DatapathConfig:
    """Settings of one node's datapath.

    Attributes:
        netns: name of the network namespace (``/run/netns/NAME``) whose pod veths are
            attached; None for the agent's own namespace (a real node).
        hook: ``"veth"`` (programs on host-side pod veths), ``"cgroup"`` (cgroup_skb
            programs on the node's cgroup v2 root: every socket of the node, whatever the
            data plane; docs/datapath.md, "The cgroup_skb hook") or ``"auto"`` (cgroup
            when the node has a cgroup v2 hierarchy and netns is None, else veth). The
            hook should be the same on every node of a cluster (docs/attribution.md; a mix
            is detected by ``ZonemeterHookMixed``). ``auto`` takes cgroup only when the
            cgroup2 directory is the hierarchy's root and a cgroup link attaches there
            (docs/datapath.md, "Which hook: auto").
        cgroup_root: the cgroup v2 directory the cgroup hook attaches to, or a directory
            whose ``unified`` subdirectory is one (the host's ``/sys/fs/cgroup`` of a hybrid
            node mounted into a container); None: the mount point of the cgroup2
            filesystem (/proc/self/mountinfo).
        uplink_patterns: fnmatch patterns of the node's uplinks: where the first hop of a
            node port is counted (``entry_hops``, both hooks; docs/datapath.md, "The first
            hop of a node port") and, on the cgroup hook, the interfaces whose own counters
            the coverage check compares with the bytes the hook counted for peers off the
            node (docs/datapath.md, "Interface counters"); empty: every physical device
            (no link kind, not loopback, not enslaved), else the devices of the default
            routes.
        entry_hops: count the first hop of node ports (a load balancer or any client off
            the node to a node address on a nodePort, a LoadBalancer ingress IP or an
            externalIP, of Services with externalTrafficPolicy Cluster) with tc programs
            on the uplinks (``bpf/uplink.h``); False: no program on the uplinks.
        scope_netns: cgroup hook only: names of network namespaces (``/run/netns/NAME``);
            when set, only packets of sockets in these namespaces are counted (needs
            ``bpf_get_netns_cookie`` for cgroup_skb, Linux 6.12+). Empty on a node (every
            socket of the node is the node's); the lab gives each lab node its pods'
            namespaces, since every namespace shares the host's cgroup tree.
        scope_cgroup: cgroup hook only: a cgroup v2 directory (absolute path under the
            cgroup2 mount); when set, packets of sockets whose cgroup is it or below it are
            counted too (either scope suffices). For labs, whose pods come and go under a
            node's cgroup (tools/lab/proc.py); a node needs none.
        attach: how the ``"veth"`` hook and the uplink programs of either hook attach:
            ``"tcx"`` (TCX links at the head of the device's list, Linux 6.6+),
            ``"clsact"`` (tc filters on a clsact qdisc), or
            ``"auto"`` (tcx when the kernel has it, else clsact; docs/datapath.md, "Hooks").
        interface_patterns: extra fnmatch patterns (``"cali*"``, ``"lxc*"``): a link whose
            name matches is attached whatever its kind.
        require_peer_netns: the default rule: attach every veth whose peer lives in another
            network namespace (the host side of a pod veth).
        exclude_patterns: fnmatch patterns of links never attached (uplinks that happen to
            be veths with a peer elsewhere, as in a lab).
        flow_capacity: flow entries per table (two tables); beyond it bytes go to the
            per-(kind, family) overflow entries, see docs/datapath.md.
        endpoint_capacity: local endpoints the kernel map holds, and entry addresses
            (``entry_hops``) the other map holds.
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
        socket_counters: cgroup hook only, an experiment (default off): an established
            TCP socket counts its packets in its own storage (BPF_MAP_TYPE_SK_STORAGE)
            after its first packet was classified, and the counts move into the flow
            table on its first packet after a drain and on close (a sock_release
            program). Cheaper per packet at many connections; not exactly once in every
            case (docs/datapath.md, "Per-socket counters").
    """

    netns: str | None = None
    hook: str = "veth"
    cgroup_root: str | None = None
    uplink_patterns: tuple[str, ...] = ()
    entry_hops: bool = True
    scope_netns: tuple[str, ...] = ()
    scope_cgroup: str | None = None
    attach: str = "auto"
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
    socket_counters: bool = False

    def validate(self) -> None:
        """Raises InputError naming the field when a setting is out of range."""
        if self.hook not in HOOKS:
            raise InputError(f"hook {self.hook!r} is not one of {', '.join(HOOKS)}",
                             source="datapath", field="hook")
        for name in self.scope_netns:
            if not _NETNS_RE.match(name):
                raise InputError(f"{name!r} is no network namespace name", source="datapath",
                                 field="scope_netns")
        if self.scope_cgroup is not None and not os.path.isabs(self.scope_cgroup):
            raise InputError(f"{self.scope_cgroup!r} is no absolute path", source="datapath",
                             field="scope_cgroup")
        if self.cgroup_root is not None and not os.path.isabs(self.cgroup_root):
            raise InputError(f"{self.cgroup_root!r} is no absolute path", source="datapath",
                             field="cgroup_root")
        if self.attach not in ATTACH_MODES:
            raise InputError(f"attach {self.attach!r} is not one of {', '.join(ATTACH_MODES)}",
                             source="datapath", field="attach")
        # every number below becomes a -D flag of the BPF compile: only true ints may pass
        ints = {"flow_capacity": self.flow_capacity, "endpoint_capacity": self.endpoint_capacity,
                "tc_priority": self.tc_priority, "tc_handle": self.tc_handle}
        if self.ephemeral_ports is not None:
            ints.update(ephemeral_ports_low=self.ephemeral_ports[0],
                        ephemeral_ports_high=self.ephemeral_ports[1])
        for name, value in ints.items():
            if type(value) is not int:
                raise InputError(f"must be an integer, got {value!r}", source="datapath", field=name)
        if self.socket_counters and self.hook != "cgroup":
            raise InputError(f"needs hook 'cgroup', got {self.hook!r}", source="datapath",
                             field="socket_counters")
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


def scope_cgroup_id(path: str) -> tuple[int, int]:
    """Return ``(id, level)`` of the cgroup v2 directory ``path``: its id (the inode number
    of its directory: kernfs_ino in include/linux/kernfs.h, what bpf_skb_ancestor_cgroup_id
    returns) and its level below the root of the cgroup2 mount it is on (the root: 0).

    Raises:
        InputError: (field ``scope_cgroup``) path is on no cgroup2 mount or cannot be read.
    """
    from agent.datapath.cgroup import cgroup2_mounts

    want = os.path.normpath(path)
    try:
        mounts = cgroup2_mounts()
    except RuntimeFailure as err:
        raise InputError(str(err), source="datapath", field="scope_cgroup") from None
    mount = max((m for m in mounts if want == m or want.startswith(m.rstrip("/") + "/")),
                key=len, default=None)
    if mount is None:
        raise InputError(f"{path!r} is on no cgroup2 mount", source="datapath",
                         field="scope_cgroup")
    try:
        ino = os.stat(want).st_ino
    except OSError as err:
        raise InputError(f"cannot read cgroup {path!r}: {err.strerror}", source="datapath",
                         field="scope_cgroup") from None
    rel = os.path.relpath(want, mount)
    return ino, 0 if rel == "." else len(rel.split(os.sep))


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
    if config.scope_netns:
        flags.append("-DZM_SCOPE_NETNS=1")
    if config.scope_cgroup is not None:
        cg_id, level = scope_cgroup_id(config.scope_cgroup)
        flags += [f"-DZM_SCOPE_CGROUP={cg_id}ULL", f"-DZM_SCOPE_CGROUP_LEVEL={level}"]
    if config.socket_counters:
        flags.append("-DZM_SOCK_COUNTERS=1")
    if config.pin_path is not None:
        check_pin_path(config.pin_path)
        flags.append(f'-DZM_PIN_DIR="{config.pin_path.rstrip("/") or "/"}"')
    return flags
