"""A local address resolved by the host veth its bytes crossed (``ClusterMetadata.resolve_veth``,
``PodTable.veth_owner``): with the veth in the flow key, an address reused however fast
goes to the pod whose veth counted the bytes, whatever the API shows at drain time."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from agent.attribution import Attributor
from agent.datapath.cgroup import PodCgroupOrder
from agent.k8s.resolve import MetadataAdapter
from agent.records import FlowDelta, FlowKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock
from tests.unit.k8s.test_cache import make

ip = ipaddress.ip_address
A = ip("10.0.1.10")


class NoHints:
    def proxy_view(self, namespace: str, service: str, node: str) -> None:
        return None


def test_old_veth_keeps_its_pod_after_the_api_shows_the_new_one() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 7, 1001)[0].name == "old"           # bound: veth 7 is old's
    clock.t = 1002.0
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1002.1  # reused 0.1 s later
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    # bytes old sent before its deletion, drained after the new pod took the address
    peer, settled = c.resolve_veth(A, 7, 1003)
    assert settled and peer.name == "old"
    assert c.resolve(A, 1003).name == "new"                        # by time: the new pod
    assert c.resolve_veth(A, 9, 1003)[0].name == "new"             # the new veth


def test_new_veth_waits_while_the_api_still_shows_the_previous_holder() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 7, 1001)[0].name == "old"
    # the new pod's veth counts bytes before the API reports anything (outage, lag)
    peer, settled = c.resolve_veth(A, 9, 1002, final=False)
    assert not settled and peer.name == "old"                     # not bound to old
    clock.t = 1005
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    peer, settled = c.resolve_veth(A, 9, 1002, final=False)
    assert settled and peer.name == "new"
    assert c.resolve_veth(A, 7, 1006)[0].name == "old"


def test_two_unbound_veths_take_the_tenures_in_ifindex_order() -> None:
    # both pods' bytes first drained after the API had seen the whole replacement
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1001
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    assert not c.resolve_veth(A, 7, 1002, final=False)[1]         # one veth, two tenures
    # with both veths seen, they pair with the tenures in ifindex order
    peer, settled = c.resolve_veth(A, 9, 1002, final=False)
    assert settled and peer.name == "new"
    peer, settled = c.resolve_veth(A, 7, 1002, final=False)
    assert settled and peer.name == "old"


def test_a_final_guess_is_redone_when_the_tenures_change() -> None:
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 7, 1001)[0].name == "old"
    assert c.resolve_veth(A, 9, 1002, final=True)[0].name == "old"  # outage: best guess
    clock.t = 1010
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 9, 1011)[0].name == "new"


def test_attribution_holds_the_new_veths_bytes_until_its_pod_is_known() -> None:
    """Workload bytes of a reused address: the old pod's (veth 7) and the new pod's
    (veth 9) counted in one drain while the API still lists the old pod; each pod gets
    exactly its own bytes, the new one's once the API reports it."""
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    a = Attributor("n1", MetadataAdapter(c), NoHints(), hold_unresolved_seconds=60)
    peer = ip("203.0.113.9")
    a.attribute([FlowDelta(FlowKind.EGRESS, A, peer, 443, 6, 100, 1, ifindex=7)], 1001)
    a.attribute([FlowDelta(FlowKind.EGRESS, A, peer, 443, 6, 30, 1, ifindex=7),
                 FlowDelta(FlowKind.EGRESS, A, peer, 443, 6, 5000, 4, ifindex=9)], 1002)
    assert a.totals().held_bytes == 5000
    clock.t = 1003
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    a.attribute([], 1004)
    t = a.totals()
    by_pod = {k.workload: v for k, v in t.workload_bytes.items()}
    assert by_pod == {"old": 130, "new": 5000} and t.held_bytes == 0


def test_remote_reuse_changes_only_the_pod_label() -> None:
    """The bound that remains: a remote address (a pod of another node) is resolved as of
    the drain. Bytes to the old holder drained after the watch delivered the reuse name the
    new holder in the pair rows, but the workload series (zone, crossing, kind) is the same
    for both holders, since the address stays on its node."""
    clock = Clock(1000)
    c = make(clock)
    local, remote = ip("10.0.1.5"), ip("10.0.2.7")
    c.apply("pods", "ADDED", k8s.pod("client", str(local), "n1", namespace="ns"))
    c.apply("pods", "ADDED", k8s.pod("old", str(remote), "n2", namespace="ns"))
    a = Attributor("n1", MetadataAdapter(c), NoHints(), hold_unresolved_seconds=60)
    rows = []
    for at, label in ((1001, "before"), (1003, "after")):
        if label == "after":  # the old holder's bytes, drained after the reuse was seen
            clock.t = 1002
            c.apply("pods", "DELETED", k8s.pod("old", str(remote), "n2", namespace="ns"))
            c.apply("pods", "ADDED", k8s.pod("new", str(remote), "n2", namespace="ns"))
        a.attribute([FlowDelta(FlowKind.EGRESS, local, remote, 5432, 6, 700, 2, ifindex=3)], at)
        a.close_interval(at + 0.5)
        rows.append({(r.client, r.server) for r in a.totals().top_pairs})
    assert rows == [{("ns/client", "ns/old")}, {("ns/client", "ns/new")}]
    series = a.totals().workload_bytes
    assert len(series) == 1 and sum(series.values()) == 1400
    key = next(iter(series))
    assert (key.workload, key.remote_zone, key.crossing) == ("client", "zone-b", "cross_zone")


def test_a_veth_recreated_under_the_deleted_pods_ifindex() -> None:
    """A CNI that creates the host side in the pod's namespace and moves it (AWS VPC CNI)
    can give the new pod's veth the deleted pod's ifindex. The binding to a tenure that
    ended more than VETH_REUSE_SECONDS before a drain is taken to be a new veth's: bytes
    drained within that time still go to the old pod (the bound for such CNIs), later
    ones to the next holder, and the index keeps that binding."""
    from agent.k8s.pods import VETH_REUSE_SECONDS

    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 7, 1001)[0].name == "old"
    clock.t = 1002
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1003
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    assert c.resolve_veth(A, 7, 1002 + VETH_REUSE_SECONDS - 1)[0].name == "old"
    peer, settled = c.resolve_veth(A, 7, 1002 + VETH_REUSE_SECONDS + 1)
    assert settled and peer.name == "new"
    assert c.resolve_veth(A, 7, 1100)[0].name == "new"  # the new pod's for its life
    assert c.resolve_veth(A, 7, 1002 + VETH_REUSE_SECONDS - 1)[0].name == "new"


def test_cgroup_hook_orders_pod_ids_by_the_order_map() -> None:
    """On the cgroup hook a key's id is the pod's cgroup, which can predate the address's
    previous holder's (kubelet makes it before mounting volumes): MetadataAdapter orders
    ids by ``veth_order`` (PodCgroupOrder: the pod's first container cgroup) instead."""
    clock = Clock(1000)
    c = make(clock)
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1002.0
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1002.1
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    # pod cgroup ids: new's (500) is older than old's (600); their containers' are not
    containers = {600: 610, 500: 700}
    asked: list[int] = []

    def order(i: int) -> int:
        asked.append(i)
        return containers[i]

    m = MetadataAdapter(c, veth_order=order)
    # both first drained after the API saw the whole replacement: the first id waits for
    # the second, then the order decides
    assert not m.resolve_veth(A, 500, 1003, False)[1]
    peer, settled = m.resolve_veth(A, 600, 1003, False)
    assert settled and peer.name == "old"
    assert m.resolve_veth(A, 500, 1003, False)[0].name == "new"
    assert asked == [500, 600, 500]
    # by the pod cgroup ids themselves the two swap
    plain = make(Clock(1000))
    plain.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    plain.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    plain.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    p = MetadataAdapter(plain)
    assert not p.resolve_veth(A, 500, 1003, False)[1]
    assert p.resolve_veth(A, 600, 1003, False)[0].name == "new"
    assert p.resolve_veth(A, 500, 1003, False)[0].name == "old"


def test_pods_without_cgroups_of_their_own_are_not_told_apart_by_a_shared_parent(
        tmp_path: Path) -> None:
    """kubelet with ``--cgroups-per-qos=false`` makes no pod cgroups: every container's
    cgroup is a child of one parent (``system.slice`` under the systemd driver), so every
    pod of the node keys that parent's id. Bound by that id, a replacement on a reused
    address would share its previous holder's key, and ``veth_owner`` would bind it to the
    old pod for ``VETH_REUSE_SECONDS``; the parent is no pod cgroup by its name
    (``POD_CGROUP_NAME``), so the address is resolved by time and the new pod's bytes go
    to it."""
    parent = tmp_path / "system.slice"
    (parent / "cri-containerd-old.scope").mkdir(parents=True)
    (parent / "cri-containerd-new.scope").mkdir()
    shared = parent.stat().st_ino & 0xFFFFFFFF
    clock = Clock(1000)
    c = make(clock)
    m = MetadataAdapter(c, veth_order=PodCgroupOrder(str(tmp_path), clock=clock))
    c.apply("pods", "ADDED", k8s.pod("old", str(A), "n1", namespace="ns"))
    assert m.resolve_veth(A, shared, 1001, False)[0].name == "old"
    clock.t = 1002.0
    c.apply("pods", "DELETED", k8s.pod("old", str(A), "n1", namespace="ns"))
    clock.t = 1002.1
    c.apply("pods", "ADDED", k8s.pod("new", str(A), "n1", namespace="ns"))
    assert c.resolve(A, 1003).name == "new"  # by time
    assert m.resolve_veth(A, shared, 1003, False)[0].name == "new"
