"""The kernel stage: BPF programs on pod veths, their maps, and the flow deltas drained.

Modules, one concern each (docs/datapath.md):

* :mod:`~agent.datapath.config`: :class:`DatapathConfig` and the cflags it becomes;
* :mod:`~agent.datapath.abi`: the one Python mirror of ``bpf/zonemeter.h``;
* :mod:`~agent.datapath.netns`: run code in a node's network namespace;
* :mod:`~agent.datapath.pins`: BPF object syscalls, pinned maps, the pin lock;
* :mod:`~agent.datapath.tcx`: TCX links through ``bpf(2)`` (create, update, pin, query);
* :mod:`~agent.datapath.cgroup`: the cgroup_skb hook's links on the cgroup v2 root;
* :mod:`~agent.datapath.attach`: :class:`Datapath` (load, attach, link watch);
* :mod:`~agent.datapath.drain`: :class:`FlowTables` (switch and drain the tables);
* :mod:`~agent.datapath.debug`: the ``python -m agent.datapath`` debug command.

Other packages import from here, never from the modules.
"""

from __future__ import annotations

from agent.datapath.attach import (
    ETH_P_ALL,
    PARENT_EGRESS,
    PARENT_INGRESS,
    CleanupResult,
    Datapath,
    DatapathStats,
    InterfaceBytes,
    link_pin_name,
)
from agent.datapath.config import (
    ATTACH_MODES,
    BPF_DIR,
    CGROUP_SOURCE,
    HOOKS,
    TC_SOURCE,
    DatapathConfig,
    check_pin_path,
    flags_for,
)
from agent.datapath.drain import FlowTables, HandOver, TableStats
from agent.datapath.netns import read_ephemeral_range, run_in_netns
from agent.datapath.pins import PINNED_MAPS, MapInfo, lock_pins, map_info, obj_get, on_bpf_fs

__all__ = [
    "ATTACH_MODES",
    "BPF_DIR",
    "ETH_P_ALL",
    "PARENT_EGRESS",
    "PARENT_INGRESS",
    "PINNED_MAPS",
    "HandOver",
    "TC_SOURCE",
    "CGROUP_SOURCE",
    "HOOKS",
    "CleanupResult",
    "Datapath",
    "DatapathConfig",
    "DatapathStats",
    "FlowTables",
    "InterfaceBytes",
    "MapInfo",
    "TableStats",
    "check_pin_path",
    "flags_for",
    "link_pin_name",
    "lock_pins",
    "map_info",
    "obj_get",
    "on_bpf_fs",
    "read_ephemeral_range",
    "run_in_netns",
]
