"""agent.datapath.cgroup without a kernel: finding the cgroup v2 hierarchy."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.datapath.cgroup import POD_CGROUP_NAME, PodCgroupOrder, cgroup2_root
from agent.errors import RuntimeFailure
from tests.fixtures.fakes import Clock

#: a pod cgroup's directory as kubelet's cgroupfs driver names it
POD = "pod0f2ab6e1-8c1d-4a55-9d0e-2b7a1c3d4e5f"

#: a hybrid layout (cgroup v1 controllers plus the unified hierarchy), as proc(5) shows it
HYBRID = """\
25 1 0:22 / / rw,relatime shared:1 - ext4 /dev/vda rw
31 25 0:27 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
40 31 0:37 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
"""


def test_hybrid_layout_gives_the_unified_mount(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(HYBRID)
    assert cgroup2_root(str(f)) == "/sys/fs/cgroup/unified"


def test_unified_layout_and_escaped_mount_points(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text("30 25 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n"
                 "50 25 0:40 / /mnt/my\\040cg rw - cgroup2 none rw\n")
    assert cgroup2_root(str(f)) == "/sys/fs/cgroup"
    f.write_text("50 25 0:40 / /mnt/my\\040cg rw - cgroup2 none rw\n")
    assert cgroup2_root(str(f)) == "/mnt/my cg"


def test_no_cgroup2_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(HYBRID.replace("cgroup2", "cgroup"))
    with pytest.raises(RuntimeFailure, match="no cgroup2 filesystem"):
        cgroup2_root(str(f))


#: a container that mounted the host's /sys/fs/cgroup (hybrid) at /run/zonemeter/cgroupv2,
#: recursively, beside its own cgroup-namespaced /sys/fs/cgroup
CONTAINER = """\
600 500 0:88 / / rw - overlay overlay rw
610 600 0:90 / /sys/fs/cgroup ro - cgroup2 cgroup rw
620 600 0:27 / /run/zonemeter/cgroupv2 ro - tmpfs tmpfs ro,mode=755
621 620 0:38 / /run/zonemeter/cgroupv2/unified ro - cgroup2 cgroup2 rw
"""


def test_cgroup_root_flag_takes_its_unified_mount_on_a_hybrid_host(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(CONTAINER)
    # without --cgroup-root the first cgroup2 mount is the container's own namespace
    assert cgroup2_root(str(f)) == "/sys/fs/cgroup"
    assert cgroup2_root(str(f), under="/run/zonemeter/cgroupv2/") == "/run/zonemeter/cgroupv2/unified"
    # a unified host: the directory itself is the mount
    f.write_text(CONTAINER.replace("tmpfs tmpfs ro,mode=755", "cgroup2 cgroup2 rw").replace(
        "621 620 0:38 / /run/zonemeter/cgroupv2/unified ro - cgroup2 cgroup2 rw\n", ""))
    assert cgroup2_root(str(f), under="/run/zonemeter/cgroupv2") == "/run/zonemeter/cgroupv2"
    # a cgroup below a mount (no mount of its own) is taken as given
    assert cgroup2_root(str(f), under="/run/zonemeter/cgroupv2/kubepods.slice") == (
        "/run/zonemeter/cgroupv2/kubepods.slice")


def test_pod_cgroup_made_since_a_recent_walk_is_still_ordered_by_its_containers(
        tmp_path: Path) -> None:
    """A pod whose cgroup was made after the last walk and first asked within
    ``rescan_seconds`` of it (drains closer than a second: a short ``--interval``, an
    early drain under table pressure) exists, with its containers: it must get its
    smallest child's id, not its own id remembered for good (its own id can predate the
    address's previous holder's containers: docs/datapath.md, "The cgroup_skb hook").
    Ids are handed out in increasing order, so only an id above every directory the last
    walk saw can be new since it; an id below it that was not there stays rate limited."""
    clock = Clock(100.0)
    order = PodCgroupOrder(str(tmp_path), clock=clock)
    assert order(0x7FFFFFF0) == 0x7FFFFFF0  # gone before asked: walks the empty tree
    assert order.walks == 1
    app = tmp_path / POD / "app"
    app.mkdir(parents=True)
    pod_id = (tmp_path / POD).stat().st_ino & 0xFFFFFFFF
    clock.advance(0.5)
    assert order(pod_id) == app.stat().st_ino & 0xFFFFFFFF
    assert order.walks == 2
    clock.advance(0.1)
    assert order(1) == 1  # below every directory seen: gone, no second walk this second
    assert order.walks == 2


def test_a_pod_cgroup_whose_path_now_names_another_cgroup_keeps_its_own_id(
        tmp_path: Path) -> None:
    """The walk remembers each id's path; by the time an id is first asked its cgroup may
    be gone and the same path made again for another cgroup (a static pod, whose pod
    cgroup's name comes from a UID that survives its re-creation). The new cgroup's
    children are not the old pod's: the id keeps its own value, as a gone one does,
    instead of sharing the newer pod's key."""
    clock = Clock(100.0)
    order = PodCgroupOrder(str(tmp_path), clock=clock)
    (tmp_path / POD / "app").mkdir(parents=True)
    old = (tmp_path / POD).stat().st_ino & 0xFFFFFFFF
    assert order(0x7FFFFFF0) == 0x7FFFFFF0  # the walk that indexes POD
    (tmp_path / POD).rename(tmp_path / "gone")  # still there: its id is not reused
    (tmp_path / POD / "app").mkdir(parents=True)
    new_app = (tmp_path / POD / "app").stat().st_ino & 0xFFFFFFFF
    assert order(old) != new_app
    assert order(old) == old


def test_pod_cgroup_names_are_kubelets_and_nothing_else() -> None:
    """Directory names of kubelet's pod cgroups, both drivers, every QoS class, a static
    pod's hash UID; and names that are not a pod's (the parent every container shares
    without pod cgroups, a container, a host unit)."""
    uid = "0f2ab6e1-8c1d-4a55-9d0e-2b7a1c3d4e5f"
    for name in (f"pod{uid}", f"kubepods-burstable-pod{uid.replace('-', '_')}.slice",
                 f"kubepods-pod{uid.replace('-', '_')}.slice",
                 f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice",
                 "pod6e6b1a0f3c9d4e2a8b7c5d1e0f9a8b7c", f"web.1.pod{uid}"):
        assert POD_CGROUP_NAME.search(name), name
    for name in ("system.slice", "kubepods.slice", "kubepods-burstable.slice", "burstable",
                 f"cri-containerd-{uid.replace('-', '')}.scope", "pod", "podman.service",
                 f"pod{uid}x", "init.scope"):
        assert not POD_CGROUP_NAME.search(name), name


def test_a_parent_shared_by_every_pod_is_0_so_its_addresses_go_by_time(tmp_path: Path) -> None:
    """kubelet with ``--cgroups-per-qos=false`` makes no pod cgroups: every container's
    cgroup is a child of one parent (``system.slice`` with the systemd driver), whose id
    tells no pods apart. It orders nothing: 0, and the address is resolved by time."""
    parent = tmp_path / "system.slice"
    (parent / "cri-containerd-old.scope").mkdir(parents=True)
    order = PodCgroupOrder(str(tmp_path), clock=Clock(100.0))
    assert order(parent.stat().st_ino & 0xFFFFFFFF) == 0
    pod = tmp_path / POD
    (pod / "app").mkdir(parents=True)
    assert order(pod.stat().st_ino & 0xFFFFFFFF) == (pod / "app").stat().st_ino & 0xFFFFFFFF
